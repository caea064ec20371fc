//! `strata materialize` (through the store's mount daemon when one
//! answers, else in this process; exit 1 when the task failed) and
//! `strata tasks` (list; `--cancel`, `--recover`, `--quarantine`).

use super::args::{MaterializeArgs, TasksArgs};
use super::render::{self, print_json};
use std::path::Path;
use strata::control;
use strata::error::Result;
use strata::materialize::recover::RecoverOptions;
use strata::materialize::{MaterializeOptions, Outcome};
use strata::store::Store;
use strata::task::{TaskRecord, TaskState, Tasks};

pub(crate) fn materialize(store: &Store, root: &Path, a: MaterializeArgs) -> Result<i32> {
    let opts = MaterializeOptions {
        set: a.set,
        generation: a.gen,
        wait: a.wait,
        plan_only: a.plan,
        cancel: Default::default(),
    };
    let o = run_materialize(store, root, &opts, a.in_process)?;
    let failed = matches!(o.state, Some(TaskState::Failed | TaskState::SourceRetired));
    let code = if failed { 1 } else { 0 };
    if a.json {
        print_json(&o)?;
        return Ok(code);
    }
    match (&o.task, o.state) {
        (None, _) => println!("{}@{} already reads from a base", o.set, o.generation),
        (Some(task), Some(state)) => println!(
            "{}@{}: task {task} {} (attempt {}, {} rows{})",
            o.set,
            o.generation,
            state.label(),
            o.attempt,
            o.rows,
            o.manifest
                .as_deref()
                .map(|m| format!(", base {}", &m[..m.len().min(16)]))
                .unwrap_or_default()
        ),
        (Some(task), None) => println!("{}@{}: task {task}", o.set, o.generation),
    }
    Ok(code)
}

/// Through the store's mount daemon when one answers, else in this process.
fn run_materialize(
    store: &Store,
    root: &Path,
    opts: &MaterializeOptions,
    in_process: bool,
) -> Result<Outcome> {
    if !opts.plan_only && !in_process {
        let request = control::Command::Materialize {
            set: opts.set.clone(),
            generation: opts.generation,
            wait: opts.wait.is_some(),
            wait_ms: opts.wait.map(|w| w.as_millis() as u64),
        };
        for socket in control::sockets(root) {
            if let Some(outcome) = control::ask_as(&socket, &request, None)? {
                return Ok(outcome);
            }
        }
    }
    strata::materialize::materialize(store, opts)
}

pub(crate) fn tasks(store: &Store, a: TasksArgs) -> Result<i32> {
    let tasks = Tasks::new(store);
    if let Some(id) = &a.cancel {
        let t = tasks.cancel(id)?;
        println!("task {id} {} (attempt {})", t.state.label(), t.attempt);
        return Ok(0);
    }
    if let Some(id) = &a.quarantine {
        return quarantine(&tasks, id, a.json);
    }
    if a.recover {
        return recover(store, a);
    }
    let mut listing = tasks.list()?;
    if a.all {
        listing.tasks.extend(tasks.compacted()?);
    }
    for c in &listing.corrupt {
        eprintln!(
            "strata: corrupt task record (see `strata tasks --quarantine {}`): key={} {}",
            c.id, c.key, c.error
        );
    }
    if a.json {
        print_json(&listing.tasks)?;
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = listing.tasks.iter().map(|t| task_row(&tasks, t)).collect();
    println!(
        "{}",
        render::table(
            &[
                "TASK",
                "STATE",
                "ATTEMPT",
                "OWNER",
                "ROWS",
                "CHECKPOINT",
                "LAST ERROR"
            ],
            &rows
        )
    );
    Ok(0)
}

fn task_row(tasks: &Tasks, t: &TaskRecord) -> Vec<String> {
    let checkpoint = match t.state.is_final() {
        true => None,
        false => tasks.checkpoint(&t.id, t.attempt).ok().flatten(),
    };
    vec![
        t.id.clone(),
        t.state.label().to_string(),
        t.attempt.to_string(),
        t.owner
            .as_deref()
            .map_or("-".into(), |o| o[..o.len().min(12)].to_string()),
        t.progress_rows.to_string(),
        checkpoint.map_or("-".into(), |c| {
            format!("{} rows, {} bytes", c.rows_folded, c.bytes_written)
        }),
        t.last_error.clone().unwrap_or_else(|| "-".into()),
    ]
}

fn quarantine(tasks: &Tasks, id: &str, json: bool) -> Result<i32> {
    let q = tasks.quarantine(id)?;
    if json {
        print_json(&q)?;
        return Ok(0);
    }
    println!(
        "task {id}: {} record(s) moved to tasks-quarantine/{id}/",
        q.moved.len()
    );
    for (set, g) in &q.withdrawn {
        println!("  withdrew its PREPARED representation of {set}@{g}");
    }
    Ok(0)
}

/// One recovery scan; exit 1 when a task is still not final after it, or a
/// record is corrupt.
fn recover(store: &Store, a: TasksArgs) -> Result<i32> {
    let opts = RecoverOptions {
        sets: (!a.set.is_empty()).then_some(a.set),
        ..RecoverOptions::default()
    };
    let report = strata::materialize::recover::recover(store, &opts)?;
    let code = match report.open() == 0 && report.corrupt.is_empty() {
        true => 0,
        false => 1,
    };
    if a.json {
        print_json(&report)?;
        return Ok(code);
    }
    for t in &report.tasks {
        println!(
            "{} {}@{}: {} {}{}",
            t.id,
            t.set,
            t.generation,
            t.action,
            t.state.label(),
            t.detail
                .as_deref()
                .map(|d| format!(" ({d})"))
                .unwrap_or_default()
        );
    }
    for c in &report.corrupt {
        println!("{}: corrupt record {} ({})", c.id, c.key, c.error);
    }
    println!(
        "{} task(s) scanned, {} still open, {} corrupt",
        report.scanned,
        report.open(),
        report.corrupt.len()
    );
    Ok(code)
}
