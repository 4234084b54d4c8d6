//! Running the benchmark programs: each one's exit, time and output, its log kept beside the
//! report.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use serde::Serialize;

use crate::record::{read_output, Output};

/// How one program of the report ran.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Run {
    /// The program (`04-mlp-inference`, `torch_models.py`, …).
    pub name: String,
    /// Whether it ran to completion with exit status 0 and printed readable records (or was
    /// skipped for a reason that is no failure).
    pub ok: bool,
    /// Whether it was left out on purpose: this machine cannot run it (too few GPUs), or it
    /// was not built (a feature it needs); `detail` says why.
    pub skipped: bool,
    /// Exit status, or why it did not run or is not usable.
    pub detail: String,
    /// Wall seconds it took.
    pub seconds: f64,
    /// Records it produced.
    pub records: usize,
}

impl Run {
    /// A program that did not run, and why.
    pub fn not_run(name: &str, why: String) -> Self {
        Run {
            name: name.to_owned(),
            ok: false,
            skipped: false,
            detail: why,
            seconds: 0.0,
            records: 0,
        }
    }

    /// A program left out on purpose, and why: no failure.
    pub fn skipped(name: &str, why: String) -> Self {
        Run {
            ok: true,
            skipped: true,
            ..Run::not_run(name, why)
        }
    }
}

/// Runs `cmd` as program `name`, keeps its whole output in `log_dir/NAME.log`, and reads its
/// records. A program that cannot start, exits non-zero or prints a JSON line that is no
/// record is not `ok`; the error is only for a log that cannot be written.
pub fn run_program(name: &str, mut cmd: Command, log_dir: &Path) -> std::io::Result<(Run, Output)> {
    let started = Instant::now();
    let result = cmd.output();
    let seconds = started.elapsed().as_secs_f64();
    let out = match result {
        Err(e) => {
            let mut run = Run::not_run(name, format!("could not start: {e}"));
            run.seconds = seconds;
            return Ok((run, Output::default()));
        }
        Ok(out) => out,
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    std::fs::write(
        log_dir.join(format!("{name}.log")),
        format!("$ {cmd:?}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"),
    )?;
    let last = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .to_owned();
    let mut run = Run {
        name: name.to_owned(),
        ok: out.status.success(),
        skipped: false,
        detail: match out.status.code() {
            Some(0) => last,
            Some(c) => format!("exit status {c}: {last}"),
            None => format!("killed by a signal: {last}"),
        },
        seconds,
        records: 0,
    };
    let output = match read_output(&stdout) {
        Ok(output) => output,
        Err(e) => {
            run.ok = false;
            run.detail = format!("{e}; see {name}.log");
            Output::default()
        }
    };
    run.records = output.records.len();
    Ok((run, output))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Record, Side};

    fn sh(script: &str) -> Command {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", script]);
        cmd
    }

    #[test]
    fn runs_reads_and_logs() {
        let dir = std::env::temp_dir().join(format!("bench-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let rec = Record::new("x", Side::Ours, "x", "x", 2.0, 1.0);
        let script = format!("echo '| table |'; echo '{}'; echo done >&2", rec.line());
        let (run, out) = run_program("good", sh(&script), &dir).unwrap();
        assert!(run.ok, "{run:?}");
        assert_eq!((run.records, run.detail.as_str()), (1, "done"));
        assert_eq!(out.records, vec![rec]);
        let log = std::fs::read_to_string(dir.join("good.log")).unwrap();
        assert!(log.contains("| table |") && log.contains("--- stderr\ndone"));

        let (run, _) = run_program("fails", sh("echo oops >&2; exit 3"), &dir).unwrap();
        assert!(!run.ok);
        assert_eq!(run.detail, "exit status 3: oops");

        let (run, out) = run_program("bad", sh("echo '{\"bench\": 1}'"), &dir).unwrap();
        assert!(!run.ok && out.records.is_empty());
        assert!(
            run.detail.starts_with("line 1 is not a benchmark record"),
            "{}",
            run.detail
        );

        let missing = Command::new(dir.join("no-such-program"));
        let (run, _) = run_program("missing", missing, &dir).unwrap();
        assert!(!run.ok && run.detail.starts_with("could not start"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
