# Shared by the benchmark scripts: source it, then call `need`.

# need COMMAND:PACKAGE... — install each Debian PACKAGE whose COMMAND is missing.
need() {
    local pkg
    for pkg in "$@"; do
        command -v "${pkg%%:*}" >/dev/null || {
            apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkg##*:}"
        }
    done
}
