//! `TENSORFOLD_STEP_EVENTS=1` (a measurement knob, speed only): CUDA events on the stream at
//! each step's first GPU work (its metadata upload, `prepare_batch`) and after the kernel
//! that picks its tokens (`argmax` / `sample`), so the GPU's time inside steps and its idle
//! time between them (the token's read by the host, the host's work, the next launch) can be
//! told apart. The backend prints their medians to stderr when it is dropped. Off, nothing
//! is recorded.

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::CudaEvent;

use super::CudaBackend;

/// The events of the steps so far: the open step's start, then (start, end) pairs.
#[derive(Default)]
pub(crate) struct StepEvents {
    open: Option<CudaEvent>,
    steps: Vec<(CudaEvent, CudaEvent)>,
}

pub(crate) fn enabled() -> bool {
    static E: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *E.get_or_init(|| std::env::var("TENSORFOLD_STEP_EVENTS").is_ok_and(|v| v == "1"))
}

fn record(be: &CudaBackend) -> Option<CudaEvent> {
    // Timing events (cudarc's default disables timing).
    let ev = be.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).ok()?;
    ev.record(&be.stream).ok()?;
    Some(ev)
}

/// A step's first GPU work is about to be issued.
pub(crate) fn step_start(be: &CudaBackend) {
    let mut s = be.step_events.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = s.as_mut() {
        s.open = record(be);
    }
}

/// The kernel that picks the step's tokens has been issued.
pub(crate) fn step_tokens(be: &CudaBackend) {
    let mut s = be.step_events.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = s.as_mut() {
        if let (Some(start), Some(end)) = (s.open.take(), record(be)) {
            s.steps.push((start, end));
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

impl Drop for StepEvents {
    fn drop(&mut self) {
        let ms = |a: &CudaEvent, b: &CudaEvent| a.elapsed_ms(b).map(f64::from).ok();
        let busy: Vec<f64> = self.steps.iter().filter_map(|(a, b)| ms(a, b)).collect();
        let idle: Vec<f64> =
            self.steps.windows(2).filter_map(|w| ms(&w[0].1, &w[1].0)).map(|x| x * 1e3).collect();
        let min = idle.iter().copied().fold(f64::INFINITY, f64::min);
        let max = idle.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        eprintln!(
            "tensorfold step events: {} steps; GPU time a step median {:.3} ms; idle between \
             steps median {:.1} us (min {min:.1}, max {max:.1})",
            self.steps.len(),
            median(busy),
            median(idle),
        );
    }
}
