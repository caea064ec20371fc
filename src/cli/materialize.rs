//! `strata materialize` (through the store's mount daemon when one
//! answers, else in this process; exit 1 when the task failed) and
//! `strata tasks` (list, or `--cancel` one).

use super::args::{MaterializeArgs, TasksArgs};
use super::render::{self, print_json};
use std::path::Path;
use strata::control;
use strata::error::Result;
use strata::materialize::{MaterializeOptions, Outcome};
use strata::store::Store;
use strata::task::{TaskState, Tasks};

pub(crate) fn materialize(store: &Store, root: &Path, a: MaterializeArgs) -> Result<i32> {
    let opts = MaterializeOptions {
        set: a.set,
        generation: a.gen,
        wait: a.wait,
        plan_only: a.plan,
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
            wait: opts.wait,
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
    if let Some(id) = &a.cancel {
        let t = Tasks::new(store).cancel(id)?;
        println!("task {id} {} (attempt {})", t.state.label(), t.attempt);
        return Ok(0);
    }
    let tasks = Tasks::new(store).list()?;
    if a.json {
        return print_json(&tasks);
    }
    let rows: Vec<Vec<String>> = tasks
        .iter()
        .map(|t| {
            vec![
                t.id.clone(),
                t.state.label().to_string(),
                t.attempt.to_string(),
                t.owner
                    .as_deref()
                    .map_or("-".into(), |o| o[..o.len().min(12)].to_string()),
                t.progress_rows.to_string(),
                t.last_error.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    println!(
        "{}",
        render::table(
            &["TASK", "STATE", "ATTEMPT", "OWNER", "ROWS", "LAST ERROR"],
            &rows
        )
    );
    Ok(0)
}
