//! Golden proofs: the reference prover must equal its snapshot in golden/ and verify,
//! and the SimDevice pipeline must produce the same bytes. With CI=true a mismatch
//! fails and nothing is rewritten; see the README for accepting an intended change.

use rstest::rstest;
use twolock::device::sim::{SimConfig, SimDevice};
use twolock::golden::{self, Case};
use twolock::prover::{Pipeline, PipelineConfig};
use twolock::reference;
use twolock::workload::Check;

fn check_case(case: Case) {
    let w = case.workload().unwrap();
    let batch = w.batch(&Case::rs()).unwrap();
    let (r, s) = batch.rs[0];
    let reference = reference::prove(&w.key.pk, &w.matrices, &w.assignments[0], r, s).unwrap();
    assert_eq!(
        w.check(&batch, 0, &reference.proof).unwrap(),
        Check::Verified
    );
    insta::with_settings!({
        snapshot_path => "../golden",
        prepend_module_to_snapshot => false,
        omit_expression => true,
    }, {
        insta::assert_yaml_snapshot!(case.name(), golden::record(&case, &w, &reference.proof));
    });
    let run = Pipeline::new(
        vec![SimDevice::new(SimConfig::default())],
        PipelineConfig::default(),
    )
    .prove_batch(batch);
    let sim = run.results[0]
        .as_ref()
        .expect("the sim pipeline proves the golden case");
    assert_eq!(
        golden::proof_hex(sim),
        golden::proof_hex(&reference.proof),
        "sim pipeline differs"
    );
}

#[rstest]
fn golden_case(
    #[values(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17)] index: usize,
) {
    let cases = golden::cases();
    assert_eq!(cases.len(), 18);
    check_case(cases[index]);
}
