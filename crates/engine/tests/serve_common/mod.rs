//! Shared by the engine-thread tests (`serve_*`): waiting for an engine to go idle.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use tf_engine::serve::{EngineHandle, EngineStats};

/// The engine's stats once no request runs or waits (panics after 60 s: a leaked lane).
pub fn settled(e: &EngineHandle) -> EngineStats {
    let t0 = Instant::now();
    loop {
        let st = e.stats();
        if st.requests_running == 0 && st.requests_waiting == 0 {
            return st;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "a lane never freed: {st:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}
