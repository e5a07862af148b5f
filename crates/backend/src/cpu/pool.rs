//! A persistent fork-join pool tuned for many short ops on a possibly busy machine.
//!
//! A forward pass issues ~400 ops per token, most of them a few microseconds long, so waking
//! workers must be cheap: idle workers spin on the job word for a while before sleeping on a
//! condvar. [`Pool::run`] runs a closure on the caller and on every worker that
//! joins before the caller has finished its own call; the caller then waits only for workers
//! that joined. Callers hand out work from an atomic counter, so a worker that the OS has not
//! scheduled (other processes on the cores) costs nothing instead of stalling the op.
//!
//! How work is split is the caller's business; the CPU kernels split output columns (or
//! (row, head) pairs) into chunks, which changes no element's arithmetic. Rejected: rayon
//! (microseconds of wake latency per op, and a job waits for all its splits) and spawning
//! threads per op.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker polls for work before sleeping on the condvar.
const SPIN: Duration = Duration::from_micros(300);
/// Busy-wait iterations of the caller between `yield_now` calls while it waits for workers
/// inside the job: short, so a caller sharing a core with such a worker gives way quickly.
const SPINS_PER_YIELD: u32 = 256;

/// `state` layout: job sequence number in the high 32 bits, `OPEN` while the caller still
/// accepts helpers, and the number of workers inside the job in the low bits.
const OPEN: u64 = 1 << 31;
const COUNT: u64 = OPEN - 1;

type Job = *const (dyn Fn(usize) + Sync);

struct Shared {
    state: AtomicU64,
    /// The current job; written by `run` before it opens the job, read by a worker only after
    /// it has entered (incremented the count of) that open job, and kept alive by `run` until
    /// the count is back to 0 with the job closed.
    job: UnsafeCell<Option<Job>>,
    panicked: AtomicBool,
    shutdown: AtomicBool,
    /// Jobs posted, and worker entries into them (diagnostics: how often helpers arrive).
    jobs: AtomicU64,
    joins: AtomicU64,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is only written by `run` while no worker can enter (the previous job is
// closed and empty, the next not yet open), and the pointee is `Sync`; every other field is a
// synchronization primitive.
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw pointer is only dereferenced inside the job it belongs to.
unsafe impl Send for Shared {}

/// The pool; `threads()` includes the calling thread.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serializes `run` calls (the backend is shared by reference) and numbers the jobs.
    run_lock: Mutex<u64>,
}

impl Pool {
    /// A pool of `threads` threads in all (at least 1): `threads - 1` workers are spawned.
    pub fn new(threads: usize) -> std::io::Result<Pool> {
        let shared = Arc::new(Shared {
            state: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            jobs: AtomicU64::new(0),
            joins: AtomicU64::new(0),
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
        Ok(Pool { shared, workers, run_lock: Mutex::new(0) })
    }

    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// (jobs posted to workers, worker entries into them) since the pool started.
    pub fn stats(&self) -> (u64, u64) {
        (self.shared.jobs.load(Ordering::Relaxed), self.shared.joins.load(Ordering::Relaxed))
    }

    /// Runs `f(0)` on the caller and `f(tid)` on each worker that picks the job up before the
    /// caller has finished its own call, then waits for those. `f` must therefore do all the
    /// work by itself if need be: callers hand out work from a shared atomic counter, so a
    /// worker that is descheduled (a busy machine) never delays an op. A panic in any thread
    /// is re-raised here after all have left the job.
    pub fn run(&self, f: &(dyn Fn(usize) + Sync)) {
        if self.workers.is_empty() {
            f(0);
            return;
        }
        let mut seq = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
        *seq = (*seq + 1) & 0xffff_ffff;
        let sh = &*self.shared;
        // SAFETY: erasing the lifetime is sound because this function does not return before
        // the job is closed and no worker is inside it.
        let job: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), Job>(f) };
        // SAFETY: no worker can be reading `job`: the previous job is closed with count 0.
        unsafe { *sh.job.get() = Some(job) };
        sh.jobs.fetch_add(1, Ordering::Relaxed);
        sh.state.store((*seq << 32) | OPEN, Ordering::SeqCst);
        if sh.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = sh.lock.lock().unwrap_or_else(|e| e.into_inner());
            sh.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| f(0)));
        sh.state.fetch_and(!OPEN, Ordering::SeqCst);
        let mut n = 0u32;
        while sh.state.load(Ordering::Acquire) & COUNT != 0 {
            n = n.wrapping_add(1);
            if n.is_multiple_of(SPINS_PER_YIELD) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
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
        {
            let _g = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

/// Whether `s` is an open job other than `seen`.
fn joinable(s: u64, seen: u64) -> bool {
    s & OPEN != 0 && s >> 32 != seen
}

fn worker(sh: &Shared, tid: usize) {
    let mut seen = 0u64;
    loop {
        if !wait_for_job(sh, seen) {
            return;
        }
        let s = sh.state.load(Ordering::Acquire);
        if !joinable(s, seen) {
            continue;
        }
        // Enter only if the job is still open: the caller cannot return while we are inside.
        if sh.state.compare_exchange(s, s + 1, Ordering::AcqRel, Ordering::Acquire).is_err() {
            continue;
        }
        seen = s >> 32;
        sh.joins.fetch_add(1, Ordering::Relaxed);
        // SAFETY: we entered the open job, so `run` wrote `job` before opening it and keeps
        // the pointee alive until we leave (decrement the count) below.
        if let Some(job) = unsafe { *sh.job.get() } {
            // SAFETY: see above.
            let f = unsafe { &*job };
            if catch_unwind(AssertUnwindSafe(|| f(tid))).is_err() {
                sh.panicked.store(true, Ordering::SeqCst);
            }
        }
        sh.state.fetch_sub(1, Ordering::Release);
    }
}

/// Polls, then sleeps, until a job other than `seen` is open; false on shutdown.
fn wait_for_job(sh: &Shared, seen: u64) -> bool {
    let start = Instant::now();
    let mut n = 0u32;
    loop {
        if sh.shutdown.load(Ordering::Relaxed) {
            return false;
        }
        if joinable(sh.state.load(Ordering::Acquire), seen) {
            return true;
        }
        // Pure spinning: yielding would hand the core to other processes for a whole time
        // slice on a busy machine, and the job would be over before we ran again.
        n = n.wrapping_add(1);
        if !n.is_multiple_of(64) || start.elapsed() < SPIN {
            std::hint::spin_loop();
            continue;
        }
        let mut g = sh.lock.lock().unwrap_or_else(|e| e.into_inner());
        sh.sleepers.fetch_add(1, Ordering::SeqCst);
        while !sh.shutdown.load(Ordering::SeqCst)
            && !joinable(sh.state.load(Ordering::SeqCst), seen)
        {
            g = sh.wake.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        sh.sleepers.fetch_sub(1, Ordering::SeqCst);
        return !sh.shutdown.load(Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_thread_runs_each_job_at_most_once() {
        let pool = Pool::new(3).unwrap();
        for round in 0..200 {
            let hits = [AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0)];
            pool.run(&|tid| {
                hits[tid].fetch_add(1, Ordering::SeqCst);
            });
            assert_eq!(hits[0].load(Ordering::SeqCst), 1, "round {round}");
            assert!(hits.iter().all(|h| h.load(Ordering::SeqCst) <= 1), "round {round}");
            if round % 50 == 0 {
                std::thread::sleep(Duration::from_millis(2)); // let workers fall asleep
            }
        }
    }

    #[test]
    fn worker_panic_is_reported() {
        let pool = Pool::new(2).unwrap();
        let joined = AtomicBool::new(false);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(&|tid| {
                if tid == 1 {
                    joined.store(true, Ordering::SeqCst);
                    panic!("boom");
                }
                // Keep the job open until the worker is in (it may join late, never early).
                while !joined.load(Ordering::SeqCst) {
                    std::thread::yield_now();
                }
            })
        }));
        assert!(r.is_err());
        pool.run(&|_| {}); // still usable
    }
}
#[cfg(test)]
mod probe {
    use super::*;
    #[test]
    #[ignore]
    fn worker_join_rate() {
        let pool = Pool::new(2).unwrap();
        let joined = AtomicUsize::new(0);
        let t0 = Instant::now();
        for _ in 0..5000 {
            let next = AtomicUsize::new(0);
            pool.run(&|tid| {
                if tid == 1 {
                    joined.fetch_add(1, Ordering::Relaxed);
                }
                while next.fetch_add(1, Ordering::Relaxed) < 40 {
                    let t = Instant::now();
                    while t.elapsed() < Duration::from_micros(1) {}
                }
            });
        }
        println!("joined {} of 5000 in {:?}", joined.load(Ordering::Relaxed), t0.elapsed());
    }
}
