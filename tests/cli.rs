//! The `twolock` binary end to end: it proves and checks, writes a valid trace, and
//! answers bad input with a typed error message and a non-zero exit, never a panic.

use std::process::{Command, Output};

fn twolock(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_twolock"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("the twolock binary runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn assert_fails_with(o: &Output, needle: &str) {
    let err = stderr(o);
    assert!(!o.status.success(), "expected failure, got success: {err}");
    assert!(!err.contains("panicked"), "the CLI panicked: {err}");
    assert!(err.contains(needle), "expected {needle:?} in: {err}");
}

#[test]
fn prove_json_reports_every_proof_verified_and_writes_a_trace() {
    let dir = tempdir("trace");
    let trace = dir.join("t.json");
    let o = twolock(&[
        "prove",
        "--log",
        "6",
        "--partitions",
        "4",
        "--device",
        "sim",
        "--json",
        "--trace",
        trace.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], true);
    let proofs = v["proofs"].as_array().unwrap();
    assert_eq!(proofs.len(), 4);
    assert!(proofs.iter().all(|p| p["result"] == "verified"));
    let t: serde_json::Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let events = t["traceEvents"].as_array().unwrap();
    for phase in [
        "prep",
        "mem hold",
        "compute hold",
        "witness map",
        "msm H",
        "B_G2 (cpu)",
    ] {
        assert!(
            events.iter().any(|e| e["name"] == phase),
            "no {phase} span in the trace"
        );
    }
    assert!(events.iter().all(|e| e["ph"] == "X" && e["dur"].is_u64()));
}

#[test]
fn truncated_and_corrupted_key_files_are_typed_errors() {
    let dir = tempdir("keys");
    let good = dir.join("good.key");
    let o = twolock(&[
        "prove",
        "--log",
        "5",
        "--partitions",
        "1",
        "--save-key",
        good.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let bytes = std::fs::read(&good).unwrap();

    let truncated = dir.join("truncated.key");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let o = twolock(&[
        "prove",
        "--log",
        "5",
        "--partitions",
        "1",
        "--key",
        truncated.to_str().unwrap(),
    ]);
    assert_fails_with(&o, "end early");

    let corrupted = dir.join("corrupted.key");
    let mut bad = bytes.clone();
    let at = bytes.len() - 200; // inside the l_query points
    bad[at] ^= 0x5a;
    std::fs::write(&corrupted, &bad).unwrap();
    let o = twolock(&[
        "prove",
        "--log",
        "5",
        "--partitions",
        "1",
        "--key",
        corrupted.to_str().unwrap(),
    ]);
    assert_fails_with(&o, "l_query");

    let o = twolock(&[
        "prove",
        "--log",
        "5",
        "--partitions",
        "1",
        "--key",
        good.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "the saved key proves: {}", stderr(&o));
}

#[test]
fn sizes_out_of_range_are_typed_errors() {
    assert_fails_with(&twolock(&["prove", "--log", "40"]), "out of range");
    assert_fails_with(&twolock(&["prove", "--log", "1"]), "out of range");
}

#[test]
fn cuda_commands_without_cuda_say_so_and_fail() {
    #[cfg(not(feature = "cuda"))]
    {
        assert_fails_with(&twolock(&["bench", "ntt"]), "CUDA");
        assert_fails_with(
            &twolock(&["prove", "--device", "cuda", "--log", "4"]),
            "CUDA",
        );
    }
}

/// `twolock stress` on the simulated device, small: 2^4 constraints, 6 partitions, a
/// soak of 12, on `devices` devices, writing its JSON report to `report`.
fn stress_sim(devices: &str, report: &std::path::Path) -> Output {
    twolock(&[
        "stress",
        "--device",
        "sim",
        "--log",
        "4",
        "--partitions",
        "6",
        "--soak",
        "12",
        "--devices",
        devices,
        "--report",
        report.to_str().unwrap(),
    ])
}

/// Runs [`stress_sim`], which must pass, and checks its report: `devices` devices, at
/// least 10 scenarios, none with a wrong proof or a leak.
fn check_stress_report(devices: u64, name: &str) {
    let report = tempdir(name).join("r.json");
    let o = stress_sim(&devices.to_string(), &report);
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        stderr(&o)
    );
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(r["devices"], devices);
    let outcomes = r["outcomes"].as_array().unwrap();
    assert!(outcomes.len() >= 10);
    assert!(outcomes
        .iter()
        .all(|o| o["wrong"] == 0 && o["leaked_bytes"] == 0));
}

#[test]
fn stress_on_sim_passes_and_writes_a_report() {
    check_stress_report(1, "stress");
}

#[test]
fn stress_on_two_sim_devices_passes_and_zero_devices_is_a_usage_error() {
    check_stress_report(2, "stress2");
    let report = tempdir("stress0").join("r.json");
    assert_fails_with(&stress_sim("0", &report), "--devices");
}

fn tempdir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("twolock-cli-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn bench_prove_runs_the_chosen_configs_and_agrees_with_ark_groth16() {
    let dir = tempdir("bench");
    let gantt = dir.join("g.svg");
    let o = twolock(&[
        "bench",
        "prove",
        "--device",
        "sim",
        "--log",
        "4",
        "--partitions",
        "3",
        "--config",
        "single:1:pool",
        "--config",
        "two:2:arena",
        "--gantt",
        gantt.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = v["configs"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[1]["mode"], "two");
    assert_eq!(rows[1]["workers"], 2);
    assert!(rows.iter().all(|r| r["agrees"] == true && r["errors"] == 0));
    assert_eq!(v["arkworks"]["equal_proofs"], 3);
    assert!(v["working_set"]["full"].as_u64().unwrap() > 0);
    let svg = std::fs::read_to_string(&gantt).unwrap();
    assert!(
        svg.starts_with("<svg") && svg.contains("compute"),
        "{svg:.200}"
    );
    assert_fails_with(
        &twolock(&["bench", "prove", "--config", "two:0:pool"]),
        "W must be a positive integer",
    );
}
