//! # 08 — the benchmark report
//!
//! One command for every benchmark: runs `02-chain`, `04-mlp-inference`, `05-decode-step`,
//! `06-train-step` and `07-dropout-train` (the example binaries next to this one) with
//! `--json`, then `scripts/torch_models.py` when `python3` is there (it skips by itself
//! without PyTorch), and writes
//!
//! * `report/report.json`: machine, library versions, every record, the summary;
//! * `report/report.md`: one table with our eager and graph times next to PyTorch's, the
//!   issue's targets with their verdicts, where graphs stop helping, the agreement checks;
//! * `report/speedup.svg`: speedup against kernels per graph and against batch size;
//! * `report/logs/*.log`: each program's full output.
//!
//! Run from the repository root (the PyTorch script is found there):
//! `cargo build --release --examples && cargo run --release --example 08-report`.
//! Options: `--out DIR`, `--batches 1,2,4` (forwarded to the MLP example and the PyTorch
//! script), `--no-torch`. The exit status is non-zero when a program failed (the report is
//! written anyway and says which).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use cuda_graphs::bench::json::records_in;
use cuda_graphs::bench::report::{
    chain_records, cuda_version_text, locked_version, utc_timestamp, Report, Run,
};
use cuda_graphs::bench::Cli;
use cuda_graphs::testing::runtime_or_skip;
use graph_runtime::cudarc;
use graph_runtime::{BoxError, Runtime};

/// The example binaries the report runs, in order.
const PROGRAMS: &[&str] = &[
    "02-chain",
    "04-mlp-inference",
    "05-decode-step",
    "06-train-step",
    "07-dropout-train",
];
const TORCH_SCRIPT: &str = "scripts/torch_models.py";

fn main() -> Result<(), BoxError> {
    let cli = Cli::from_env();
    let out_dir = PathBuf::from(cli.value("out").unwrap_or("report"));
    let batches = cli.value("batches").map(str::to_owned);
    let Some(rt) = runtime_or_skip("08-report") else {
        return Ok(());
    };
    // 1. The machine and the libraries, read before the runtime is dropped (the programs
    //    each open their own).
    let env = environment(&rt);
    drop(rt);

    let here = std::env::current_exe()?
        .parent()
        .ok_or("the report binary has no parent directory")?
        .to_path_buf();
    std::fs::create_dir_all(out_dir.join("logs"))?;
    let mut report = Report {
        env,
        ..Report::default()
    };

    // 2. Our benchmarks.
    for &name in PROGRAMS {
        let path = here.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
        let mut args: Vec<String> = Vec::new();
        if name != "02-chain" {
            // 02-chain prints tables only; its rows are read from them.
            args.push("--json".into());
        }
        if let (Some(b), "04-mlp-inference") = (&batches, name) {
            args.extend(["--batches".to_owned(), b.clone()]);
        }
        if !path.exists() {
            report.runs.push(Run {
                name: name.to_owned(),
                ok: false,
                detail: format!(
                    "{} not found: build the examples first (`cargo build --release --examples`)",
                    path.display()
                ),
                seconds: 0.0,
                records: 0,
            });
            continue;
        }
        let mut cmd = Command::new(&path);
        cmd.args(&args);
        let (mut run, stdout) = run_program(name, cmd, &out_dir)?;
        let records = if name == "02-chain" {
            chain_records(&stdout)
        } else {
            records_in(&stdout)
        };
        run.records = records.len();
        if run.ok && records.is_empty() {
            // A run that printed nothing the report can read is a broken benchmark.
            run.ok = false;
            run.detail = "exited 0 but printed no record the report recognises".into();
        }
        report.runs.push(run);
        report.records.extend(records);
    }

    // 3. PyTorch, same workloads, when the script and python3 are here.
    if cli.flag("no-torch") {
        eprintln!("PyTorch: skipped (--no-torch)");
    } else if !Path::new(TORCH_SCRIPT).exists() {
        report.runs.push(Run {
            name: "torch_models.py".into(),
            ok: false,
            detail: format!("{TORCH_SCRIPT} not found: run the report from the repository root"),
            seconds: 0.0,
            records: 0,
        });
    } else {
        let mut cmd = Command::new("python3");
        cmd.arg(TORCH_SCRIPT);
        if let Some(b) = &batches {
            cmd.args(["--batches", b]);
        }
        let (mut run, stdout) = run_program("torch_models.py", cmd, &out_dir)?;
        let records = records_in(&stdout);
        for r in records.iter().filter(|r| r.str("bench") == Some("env")) {
            for (key, what) in [
                ("torch", "PyTorch"),
                ("cuda", "PyTorch CUDA"),
                ("device", "PyTorch device"),
            ] {
                if let Some(v) = r.str(key) {
                    report.env.push((what.to_owned(), v.to_owned()));
                }
            }
        }
        run.records = records.len();
        report.runs.push(run);
        report.records.extend(records);
    }

    // 4. Write everything.
    let md = report.markdown();
    std::fs::write(out_dir.join("report.md"), &md)?;
    std::fs::write(out_dir.join("report.json"), report.json().pretty() + "\n")?;
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

/// Runs one program, keeps its output in `logs/NAME.log` and passes its stderr through.
fn run_program(name: &str, mut cmd: Command, out_dir: &Path) -> Result<(Run, String), BoxError> {
    eprintln!("running {name} …");
    let started = Instant::now();
    let result = cmd.output();
    let seconds = started.elapsed().as_secs_f64();
    let log = out_dir.join("logs").join(format!("{name}.log"));
    let (run, stdout) = match result {
        Err(e) => (
            Run {
                name: name.to_owned(),
                ok: false,
                detail: format!("could not start: {e}"),
                seconds,
                records: 0,
            },
            String::new(),
        ),
        Ok(out) => {
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            std::fs::write(
                &log,
                format!("$ {cmd:?}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"),
            )?;
            let last = stderr
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
                .to_owned();
            let detail = match out.status.code() {
                Some(0) => last,
                Some(c) => format!("exit status {c}: {last}"),
                None => format!("killed by a signal: {last}"),
            };
            (
                Run {
                    name: name.to_owned(),
                    ok: out.status.success(),
                    detail,
                    seconds,
                    records: 0,
                },
                stdout,
            )
        }
    };
    eprintln!(
        "{name}: {} in {seconds:.1} s{}",
        if run.ok { "ok" } else { "FAILED" },
        if run.detail.is_empty() {
            String::new()
        } else {
            format!(" ({})", run.detail)
        }
    );
    Ok((run, stdout))
}

/// Machine and library facts for the report's header.
fn environment(rt: &Runtime) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = Vec::new();
    let mut put = |k: &str, v: String| env.push((k.to_owned(), v));
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    put("generated", utc_timestamp(now));
    put(
        "GPU",
        rt.context()
            .name()
            .unwrap_or_else(|e| format!("unknown ({e})")),
    );
    let (major, minor) = rt.compute_capability();
    put("compute capability", format!("{major}.{minor}"));
    put(
        "streaming multiprocessors",
        rt.multiprocessors().to_string(),
    );
    if let Ok((_, total)) = rt.mem_info() {
        put(
            "GPU memory",
            format!("{:.1} GiB", total as f64 / (1u64 << 30) as f64),
        );
    }
    if let Some(v) = command_line(
        "nvidia-smi",
        &["--query-gpu=driver_version", "--format=csv,noheader"],
    ) {
        put("NVIDIA driver", v);
    }
    let mut driver = 0i32;
    // SAFETY: the runtime exists, so the driver library is loaded; the call writes one int.
    let r = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver) };
    if r == cudarc::driver::sys::CUresult::CUDA_SUCCESS {
        put("CUDA driver API", cuda_version_text(driver));
    }
    let mut parts = [0i32; 3];
    let props = [
        cudarc::cublas::sys::libraryPropertyType_t::MAJOR_VERSION,
        cudarc::cublas::sys::libraryPropertyType_t::MINOR_VERSION,
        cudarc::cublas::sys::libraryPropertyType_t::PATCH_LEVEL,
    ];
    let mut cublas_ok = true;
    for (slot, prop) in parts.iter_mut().zip(props) {
        // SAFETY: the runtime created a cuBLAS handle, so the library is loaded; the call
        // writes one int.
        let status = unsafe { cudarc::cublas::sys::cublasGetProperty(prop, slot) };
        cublas_ok &= status == cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS;
    }
    if cublas_ok {
        put("cuBLAS", format!("{}.{}.{}", parts[0], parts[1], parts[2]));
    }
    // SAFETY: a dlopen probe without preconditions.
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        let (mut major, mut minor) = (0i32, 0i32);
        // SAFETY: NVRTC is present (checked just above); the call writes two ints.
        let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
        if r == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
            put("NVRTC", format!("{major}.{minor}"));
        }
    }
    put(
        "cuda-graphs / graph-runtime",
        env!("CARGO_PKG_VERSION").to_owned(),
    );
    let lock = std::fs::read_to_string("Cargo.lock")
        .or_else(|_| std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock")))
        .unwrap_or_default();
    put(
        "cudarc",
        locked_version(&lock, "cudarc").unwrap_or_else(|| "unknown (no Cargo.lock here)".into()),
    );
    if let Ok(cpu) = std::fs::read_to_string("/proc/cpuinfo") {
        if let Some(model) = cpu
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
        {
            put("host CPU", model.trim().to_owned());
        }
    }
    if let Ok(os) = std::fs::read_to_string("/etc/os-release") {
        if let Some(name) = os.lines().find_map(|l| l.strip_prefix("PRETTY_NAME=")) {
            put("host OS", name.trim_matches('"').to_owned());
        }
    }
    env
}

/// The first line a command prints, if it runs and succeeds.
fn command_line(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.is_empty())
}
