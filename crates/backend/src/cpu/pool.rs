//! A persistent fork-join pool with spin-then-sleep workers, tuned for many short ops.
//!
//! A forward pass issues ~400 ops per token, most of them a few microseconds long, so the
//! cost of waking workers dominates small ops: workers spin on an epoch counter for a while
//! after each job (waking in well under a microsecond) and only then sleep on a condvar.
//! [`Pool::run`] runs one closure on every thread (the caller is thread 0) and returns when
//! all have finished, so the closure may borrow from the caller's stack.
//!
//! How work is split is the caller's business; the CPU kernels split output columns (or
//! (row, head) pairs) into chunks taken from an atomic counter, which changes no element's
//! arithmetic. Rejected: rayon (its sleep/wake latency is tens of microseconds on a busy
//! 2-core box) and spawning threads per op.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before sleeping.
const SPIN: Duration = Duration::from_micros(200);

type Job = *const (dyn Fn(usize) + Sync);

struct Shared {
    epoch: AtomicU64,
    /// The current job; written by `run` before the epoch is bumped, read by workers after
    /// they observe the bump, and not touched again until every worker has finished.
    job: UnsafeCell<Option<Job>>,
    pending: AtomicUsize,
    panicked: AtomicBool,
    shutdown: AtomicBool,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is only written while no worker reads it (between jobs, under `run_lock`),
// and the pointee is `Sync`; every other field is a synchronization primitive.
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw pointer is only dereferenced during the job it belongs to.
unsafe impl Send for Shared {}

/// The pool; `threads()` includes the calling thread.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serializes `run` calls from different threads (the backend is shared by reference).
    run_lock: Mutex<()>,
}

impl Pool {
    /// A pool of `threads` threads in all (at least 1): `threads - 1` workers are spawned.
    pub fn new(threads: usize) -> std::io::Result<Pool> {
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            pending: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let mut workers = Vec::new();
        for tid in 1..threads.max(1) {
            let sh = shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("tf-cpu-{tid}"))
                .spawn(move || worker(&sh, tid))?;
            workers.push(h);
        }
        Ok(Pool { shared, workers, run_lock: Mutex::new(()) })
    }

    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(tid)` on every thread, `tid` in `0..threads()`, the caller being 0, and waits
    /// for all. A panic in any thread is re-raised here after all have finished.
    pub fn run(&self, f: &(dyn Fn(usize) + Sync)) {
        if self.workers.is_empty() {
            f(0);
            return;
        }
        let _serial = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
        let sh = &*self.shared;
        // SAFETY: erasing the lifetime is sound because this function does not return before
        // `pending` reaches 0, i.e. before every worker has finished calling the job.
        let job: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), Job>(f) };
        // SAFETY: no worker reads `job` now: the previous job finished (pending == 0) and
        // workers only read it after seeing the epoch bump below.
        unsafe { *sh.job.get() = Some(job) };
        sh.pending.store(self.workers.len(), Ordering::SeqCst);
        sh.epoch.fetch_add(1, Ordering::SeqCst);
        if sh.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = sh.lock.lock().unwrap_or_else(|e| e.into_inner());
            sh.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| f(0)));
        let mut spins = 0u32;
        while sh.pending.load(Ordering::Acquire) != 0 {
            spins += 1;
            if spins < 1 << 16 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if sh.panicked.swap(false, Ordering::SeqCst) {
            panic!("a CPU backend worker thread panicked");
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        self.shared.epoch.fetch_add(1, Ordering::SeqCst);
        {
            let _g = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

fn worker(sh: &Shared, tid: usize) {
    let mut seen = 0u64;
    loop {
        seen = wait_for_epoch(sh, seen);
        if sh.shutdown.load(Ordering::SeqCst) {
            return;
        }
        // SAFETY: `run` wrote the job before bumping the epoch (SeqCst) and keeps it alive
        // until `pending` reaches 0, which happens only after this call returns.
        let job = unsafe { *sh.job.get() };
        if let Some(job) = job {
            // SAFETY: see above; the pointee outlives this call.
            let f = unsafe { &*job };
            if catch_unwind(AssertUnwindSafe(|| f(tid))).is_err() {
                sh.panicked.store(true, Ordering::SeqCst);
            }
        }
        sh.pending.fetch_sub(1, Ordering::Release);
    }
}

/// Spins, then sleeps, until the epoch differs from `seen`; returns the new epoch.
fn wait_for_epoch(sh: &Shared, seen: u64) -> u64 {
    let start = Instant::now();
    let mut n = 0u32;
    loop {
        let e = sh.epoch.load(Ordering::Acquire);
        if e != seen {
            return e;
        }
        n = n.wrapping_add(1);
        if n % 64 != 0 || start.elapsed() < SPIN {
            std::hint::spin_loop();
            continue;
        }
        let mut g = sh.lock.lock().unwrap_or_else(|e| e.into_inner());
        sh.sleepers.fetch_add(1, Ordering::SeqCst);
        loop {
            let e = sh.epoch.load(Ordering::SeqCst);
            if e != seen {
                sh.sleepers.fetch_sub(1, Ordering::SeqCst);
                return e;
            }
            g = sh.wake.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_runs_each_job_once() {
        let pool = Pool::new(3).unwrap();
        for round in 0..200 {
            let hits = [AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0)];
            pool.run(&|tid| {
                hits[tid].fetch_add(1, Ordering::SeqCst);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::SeqCst) == 1), "round {round}");
            if round % 50 == 0 {
                std::thread::sleep(Duration::from_millis(2)); // let workers fall asleep
            }
        }
    }

    #[test]
    fn worker_panic_is_reported() {
        let pool = Pool::new(2).unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(&|tid| {
                if tid == 1 {
                    panic!("boom");
                }
            })
        }));
        assert!(r.is_err());
        pool.run(&|_| {}); // still usable
    }
}
