//! The exactness checkers on the real test model (CPU backend): each must pass, with its
//! planted control caught, and the fingerprint must be a function of the state alone.
//! Sizes are smaller than the CLI's defaults to keep the run to seconds on 2 cores.

mod check_common;

use check_common::{model, progress, tokens};
use tf_backend::Backend;
use tf_engine::check::{self, fingerprint, record::SeqRecord, CheckOutcome};
use tf_engine::generate::BLOCK_SIZE;

fn assert_pass(o: &CheckOutcome) {
    println!("{o}");
    for c in &o.comparisons {
        for d in c.diffs.iter().take(5) {
            println!("  {}: {d}", c.label);
        }
    }
    assert!(o.plant.caught(), "planted control not caught: {}", o.plant);
    assert!(o.passed(), "{o}");
    assert!(o.compared.logit_rows > 0 && o.compared.kv_rows > 0 && o.compared.layers == 30);
}

#[test]
fn windows_equal_whole_prefill() {
    let mut m = model().unwrap();
    let toks = tokens(72);
    let opts = check::WindowsOpts { seed: 1, ..Default::default() };
    let o = check::windows(m.as_mut(), &toks, &opts, &mut progress("windows")).unwrap();
    assert_pass(&o);
    // 4 fixed chunkings and the ragged run, each of 72 rows.
    assert_eq!((o.compared.comparisons, o.compared.logit_rows), (5, 5 * 72));
    // The fingerprint depends on the state, not on the seed's choices of tables and plants.
    let opts2 = check::WindowsOpts { chunks: vec![24], ragged: false, seed: 2 };
    let o2 = check::windows(m.as_mut(), &toks, &opts2, &mut progress("windows")).unwrap();
    assert_pass(&o2);
    assert_eq!(o.fingerprint, o2.fingerprint);
    let o3 = check::windows(m.as_mut(), &toks[..71], &opts2, &mut progress("windows")).unwrap();
    assert_ne!(o.fingerprint, o3.fingerprint);
}

#[test]
fn concurrent_equals_solo() {
    let mut m = model().unwrap();
    let toks = tokens(96);
    let opts =
        check::ConcurrentOpts { mixes: 2, max_seqs: 16, max_len: 24, max_chunk: 12, seed: 3 };
    let o = check::concurrent(m.as_mut(), &toks, &opts, &mut progress("concurrent")).unwrap();
    assert_pass(&o);
}

#[test]
fn resumed_equals_fresh() {
    let mut m = model().unwrap();
    let toks = tokens(96);
    let opts = check::ResumedOpts { cases: 2, extra_steps: 4, seed: 4 };
    let o = check::resumed(m.as_mut(), &toks, &opts, &mut progress("resumed")).unwrap();
    assert_pass(&o);
    assert_eq!(o.compared.comparisons, 4);
}

#[test]
fn seeded_equal_across_restart_and_batch_and_seed_matters() {
    let mut m = model().unwrap();
    let toks = tokens(96);
    let opts = check::SeededOpts {
        prompt_len: 20,
        gen_tokens: 10,
        others: 3,
        seed: 5,
        ..Default::default()
    };
    let mut restart = model;
    let o = check::seeded(m.as_mut(), &mut restart, &toks, &opts, &mut progress("seeded")).unwrap();
    assert_pass(&o);
    assert_eq!(o.compared.sampled, 20);
    // The other seed changed tokens (a failure otherwise), and the note says how many.
    assert!(o.notes.iter().any(|n| n.contains("seed 6 changed")), "{:?}", o.notes);
}

/// The fingerprint read straight from the pool equals the one of the same state's record.
#[test]
fn state_fingerprint_matches_record() {
    let mut m = model().unwrap();
    let toks = tokens(40);
    let be_geom = m.kv_geometry(BLOCK_SIZE, 4);
    let mut kv = m.backend().alloc_kv(&be_geom).unwrap();
    let table = vec![2u32, 0, 3];
    let meta = tf_backend::BatchMeta {
        tokens: toks.clone(),
        positions: (0..40).collect(),
        row_seq: vec![0; 40],
        seqs: vec![tf_backend::SeqMeta { block_table: table.clone() }],
        logit_rows: (0..40).collect(),
        block_size: BLOCK_SIZE,
    };
    let logits = m.forward(&mut kv, &meta).unwrap();
    let vocab = m.spec().vocab_size;
    let last = &logits[39 * vocab..];
    let layers = m.spec().num_hidden_layers;
    let f = fingerprint::state(m.backend(), &kv, layers, &table, 40, last).unwrap();
    let seq = SeqRecord::capture(m.as_ref(), &kv, &table, toks, (0, logits.clone())).unwrap();
    let rec = check::Record { seqs: vec![seq], vocab, kv_dim: m.spec().kv_dim() };
    assert_eq!(f, fingerprint::record(&rec));
    let f39 = fingerprint::state(m.backend(), &kv, layers, &table, 39, last).unwrap();
    assert_ne!(f, f39);
}
