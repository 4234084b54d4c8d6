//! # 08 — the benchmark report
//!
//! Borrows from this workspace: `workloads` (the machine's GPU and host facts, the runtime or a
//! skip) and `bench-report` (running the programs, the summary and the report's files).
//!
//! One command for every benchmark: runs every example (the binaries next to this one), the
//! benchmarks among them with `--json`: `02-chain`, `04-mlp-inference`, `05-decode-step`,
//! `06-train-step`, `07-dropout-train`, `14-decode-loop`, `15-jacobi-solve`, the eager-islands
//! examples `21-islands-decoder`, `22-islands-sampler` and `23-islands-compaction`, the two-GPU
//! `10-tensor-parallel-mlp`, `11-data-parallel-train` and `24-allreduce-floor` (built with `--features nccl`;
//! skipped, with the reason, on a machine of one GPU), the candle tier `12-candle-mlp` and
//! `13-candle-decoder`, the real-models tier `17-candle-bert`, `18-candle-resnet` and
//! `19-candle-llama-window`, and `20-candle-upload-cap` (when built with `--features candle`),
//! `25-tensor-parallel-llama` on 1, 2 and 4 GPUs (`--features candle,nccl`); `01`, `03`, `09`, `26` and `27` are
//! run for a clean exit. Then `scripts/torch_chain.py`, `scripts/torch_models.py`,
//! `scripts/torch_decode_loop.py` and `scripts/torch_real_models.py` when `python3` is there
//! (they skip by themselves without PyTorch, transformers or torchvision). It reads the JSON lines they print (`bench_report::record`) and writes
//!
//! * `report/report.json`: machine, library versions, every record, the summary;
//! * `report/report.md`: one table per workload family with our eager and graph times next
//!   to PyTorch's, the targets with their verdicts, where graphs stop helping, the
//!   agreement checks, the programs run (or skipped, and why);
//! * `report/speedup.svg`: speedup against kernels per graph and against batch size;
//! * `report/logs/*.log`: each program's full output.
//!
//! Run from the repository root (the PyTorch scripts are found there):
//! `cargo build --release --examples && cargo run --release --example 08-report`. With the
//! multi-GPU programs (`--features nccl`, or `candle,nccl`), start it through
//! `bash scripts/with-nccl.sh` so that they find libnccl.
//! The exit status is non-zero when a program failed (the report is written anyway and says
//! which).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use bench_report::programs::{run_program, Run};
use bench_report::summary::Report;
use bench_report::versions::{built_version, utc_timestamp};
use clap::Parser;
use graph_runtime::BoxError;
use workloads::machine::{gpu_facts, host_facts};
use workloads::testing::{runtime_or_skip, usable_gpus};

/// Runs every benchmark and writes the report (Markdown, JSON, SVG and the programs' logs).
#[derive(Parser)]
struct Args {
    /// Where the report goes.
    #[arg(long, default_value = "report")]
    out: PathBuf,
    /// Batch sizes of the MLP, comma-separated (passed to `04-mlp-inference` and to PyTorch).
    #[arg(long)]
    batches: Option<String>,
    /// Leave out the PyTorch scripts.
    #[arg(long)]
    no_torch: bool,
}

/// One example binary the report runs.
struct Program {
    name: &'static str,
    flags: &'static [&'static str],
    /// Whether it prints benchmark records (the others are checked for a clean exit).
    records: bool,
    /// The cargo feature it is built with, if any: without it the binary is absent, and the
    /// report says so instead of failing.
    feature: Option<&'static str>,
    /// GPUs it needs.
    gpus: usize,
}

const fn program(name: &'static str, flags: &'static [&'static str]) -> Program {
    Program {
        name,
        flags,
        records: true,
        feature: None,
        gpus: 1,
    }
}

/// Every example the report runs, in order.
const PROGRAMS: &[Program] = &[
    Program {
        records: false,
        ..program("01-first-graph", &[])
    },
    // PyTorch's chain runs from the report, below, like its other figures.
    program("02-chain", &["--json", "--no-torch"]),
    Program {
        records: false,
        ..program("03-rng-fill", &[])
    },
    program("04-mlp-inference", &["--json"]),
    program("05-decode-step", &["--json"]),
    program("06-train-step", &["--json"]),
    program("07-dropout-train", &["--json"]),
    Program {
        records: false,
        ..program("09-user-rng-kernel", &[])
    },
    Program {
        feature: Some("nccl"),
        gpus: 2,
        ..program("10-tensor-parallel-mlp", &["--json"])
    },
    Program {
        feature: Some("nccl"),
        gpus: 2,
        ..program("11-data-parallel-train", &["--json"])
    },
    // The all-reduce at its floor, with PyTorch's graphed all-reduce beside it.
    Program {
        feature: Some("nccl"),
        gpus: 2,
        ..program("24-allreduce-floor", &["--json", "--torch"])
    },
    // Tensor-parallel decoding on every GPU count the machine has, PyTorch beside it.
    Program {
        feature: Some("candle,nccl"),
        ..program("25-tensor-parallel-llama", &["--json", "--torch"])
    },
    Program {
        feature: Some("candle"),
        ..program("12-candle-mlp", &["--json"])
    },
    Program {
        feature: Some("candle"),
        ..program("13-candle-decoder", &["--json"])
    },
    program("14-decode-loop", &["--json"]),
    program("15-jacobi-solve", &["--json"]),
    // Eager islands between graphed segments (bench `islands`).
    program("21-islands-decoder", &["--json"]),
    program("22-islands-sampler", &["--json"]),
    program("23-islands-compaction", &["--json"]),
    // A bucket family serving batches of 1 to 20 rows (a clean exit: every reply = eager).
    Program {
        records: false,
        ..program("26-bucket-family", &[])
    },
    // An eager island between two segments (a clean exit: replays = eager, bitwise).
    Program {
        records: false,
        ..program("27-island-sampler", &[])
    },
    // The real-models tier: candle-transformers models as they are (bench `real_models`).
    Program {
        feature: Some("candle"),
        ..program("17-candle-bert", &["--json"])
    },
    Program {
        feature: Some("candle"),
        ..program("18-candle-resnet", &["--json"])
    },
    Program {
        feature: Some("candle"),
        ..program("19-candle-llama-window", &["--json"])
    },
    // T5, Qwen2 and Phi windows: those candle-core's upload limit lets capture (all of them
    // with scripts/candle-upload-cap.sh), same bench.
    Program {
        feature: Some("candle"),
        ..program("20-candle-upload-cap", &["--json"])
    },
];
/// The PyTorch scripts, in order, with their arguments.
const TORCH_SCRIPTS: &[(&str, &[&str])] = &[
    ("scripts/torch_chain.py", &[]),
    ("scripts/torch_models.py", &[]),
    ("scripts/torch_decode_loop.py", &["--json"]),
    ("scripts/torch_real_models.py", &[]),
];

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let out_dir = args.out;
    let Some(rt) = runtime_or_skip("08-report") else {
        return Ok(());
    };
    // 1. The machine and the libraries, read before the runtime is dropped (the programs
    //    each open their own).
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut env = vec![("generated".to_owned(), utc_timestamp(now))];
    env.extend(gpu_facts(&rt));
    drop(rt);
    let gpus = usable_gpus().unwrap_or(1);
    for (what, package) in [
        ("cuda-graphs / graph-runtime", "graph-runtime"),
        ("cudarc", "cudarc"),
    ] {
        let version = built_version(package).unwrap_or_else(|| "unknown".into());
        env.push((what.to_owned(), version));
    }
    env.extend(host_facts());

    let here = std::env::current_exe()?
        .parent()
        .ok_or("the report binary has no parent directory")?
        .to_path_buf();
    let logs = out_dir.join("logs");
    std::fs::create_dir_all(&logs)?;
    let mut report = Report {
        env,
        ..Report::default()
    };

    // 2. Our benchmarks.
    for p in PROGRAMS {
        let name = p.name;
        let path = here.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
        if !path.exists() {
            let run = match p.feature {
                Some(feature) => Run::skipped(
                    name,
                    format!(
                        "not built: it needs the `{feature}` feature \
                         (`cargo build --release --examples --features {feature}`)"
                    ),
                ),
                None => Run::not_run(
                    name,
                    format!(
                        "{} not found: build the examples first (`cargo build --release --examples`)",
                        path.display()
                    ),
                ),
            };
            say(&run);
            report.runs.push(run);
            continue;
        }
        if p.gpus > gpus {
            let run = Run::skipped(
                name,
                format!("it needs {} GPUs, this machine has {gpus}", p.gpus),
            );
            say(&run);
            report.runs.push(run);
            continue;
        }
        let mut cmd = Command::new(&path);
        // `--no-torch` leaves out the PyTorch references the programs would run themselves.
        cmd.args(
            p.flags
                .iter()
                .filter(|f| !(args.no_torch && **f == "--torch")),
        );
        if let (Some(b), "04-mlp-inference") = (&args.batches, name) {
            cmd.args(["--batches", b]);
        }
        eprintln!("running {name} …");
        let (mut run, output) = run_program(name, cmd, &logs)?;
        if run.ok && p.records && output.records.is_empty() {
            // A run that printed nothing the report can read is a broken benchmark.
            run.ok = false;
            run.detail = "exited 0 but printed no record".into();
        }
        say(&run);
        report.runs.push(run);
        report.records.extend(output.records);
    }

    // 3. PyTorch, same workloads, when the scripts and python3 are here.
    for &(script, flags) in TORCH_SCRIPTS {
        let name = Path::new(script)
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or(script);
        if args.no_torch {
            eprintln!("{name}: skipped (--no-torch)");
            continue;
        }
        if !Path::new(script).exists() {
            report.runs.push(Run::not_run(
                name,
                format!("{script} not found: run the report from the repository root"),
            ));
            continue;
        }
        let mut cmd = Command::new("python3");
        cmd.arg(script).args(flags);
        if let (Some(b), "torch_models.py") = (&args.batches, name) {
            cmd.args(["--batches", b]);
        }
        eprintln!("running {name} …");
        let (run, output) = run_program(name, cmd, &logs)?;
        say(&run);
        report.runs.push(run);
        report.env.extend(output.env);
        report.records.extend(output.records);
    }

    // 4. Write everything.
    let md = report.markdown();
    std::fs::write(out_dir.join("report.md"), &md)?;
    let json = serde_json::to_string_pretty(&report.json())?;
    std::fs::write(out_dir.join("report.json"), json + "\n")?;
    std::fs::write(out_dir.join("speedup.svg"), report.svg())?;
    println!("{md}");
    println!(
        "wrote {0}/report.md, {0}/report.json, {0}/speedup.svg and {0}/logs/",
        out_dir.display()
    );
    let failed: Vec<&str> = report
        .runs
        .iter()
        .filter(|r| !r.ok)
        .map(|r| r.name.as_str())
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "programs failed: {}; see {}/logs",
            failed.join(", "),
            out_dir.display()
        )
        .into())
    }
}

/// One line on stderr: how a program ran.
fn say(run: &Run) {
    eprintln!(
        "{}: {} in {:.1} s{}",
        run.name,
        if run.ok { "ok" } else { "FAILED" },
        run.seconds,
        if run.detail.is_empty() {
            String::new()
        } else {
            format!(" ({})", run.detail)
        }
    );
}
