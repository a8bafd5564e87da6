//! The threads that trace a frozen job, side by side.
//!
//! ptrace binds a tracee to the thread that seized it: only that thread may ask anything of
//! it (the kernel checks `child->parent == current`), and a tracee is let go when its tracer
//! thread ends. So a job is split among a few long-lived tracer threads, each seizing,
//! asking and releasing its own share, and a checkpoint's stages run on all of them at once:
//! a stop of one tracee (a round trip through the scheduler, most of what a process costs the
//! freeze) is waited for while the other tracers work.
//!
//! The threads are a rayon-core pool: its `broadcast` runs a closure once on each of its
//! threads, by index, and waits for all of them, which lets the closure borrow what the
//! caller holds; its threads live as long as the pool. (A waitpid for a given tracee may come
//! from any thread of the agent; every other ptrace request must come from its tracer.)

use std::io;
use std::sync::Mutex;

/// A fixed set of tracer threads, numbered from 0. One tracer is the calling thread itself
/// (no pool): the tree is then driven as before there were several, by the thread that froze
/// it, which must be the one to use it to its release.
pub struct Tracers {
    pool: Option<rayon_core::ThreadPool>,
}

/// The most tracer threads a job gets: past this, the tracers contend for the CPUs the
/// capture's reading thread and the pool's writers need.
pub const MAX_TRACERS: usize = 8;

impl Tracers {
    /// `count` tracer threads (at least one).
    pub fn new(count: usize) -> io::Result<Tracers> {
        if count <= 1 {
            return Ok(Tracers { pool: None });
        }
        let pool = rayon_core::ThreadPoolBuilder::new()
            .num_threads(count.max(1))
            .thread_name(|i| format!("ckpt-tracer-{i}"))
            .build()
            .map_err(|e| io::Error::other(format!("start the tracer threads: {e}")))?;
        Ok(Tracers { pool: Some(pool) })
    }

    /// As many tracers as a job is given: `CKPT_TRACERS`, or else one per CPU the agent may
    /// run on (its affinity and its cgroup's quota: a Slurm allocation's share of the node),
    /// at most [`MAX_TRACERS`]. The tracers' work is mostly waits for their tracees' stops, which
    /// the others fill: on two CPUs, two tracers froze 256 processes of 8 MiB in 102-119 ms
    /// where one took 129-149 (runs in turn, docs/PLAN-SCALE.md, session 36).
    pub fn for_job() -> io::Result<Tracers> {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let wanted = std::env::var("CKPT_TRACERS").ok().and_then(|v| v.parse().ok()).unwrap_or(cpus);
        Tracers::new(wanted.clamp(1, MAX_TRACERS))
    }

    pub fn count(&self) -> usize {
        self.pool.as_ref().map_or(1, |p| p.current_num_threads())
    }

    /// Runs `f(i)` on tracer `i`, for every tracer at once; returns their results by index
    /// once every one has returned.
    pub fn each<R: Send>(&self, f: impl Fn(usize) -> R + Sync) -> Vec<R> {
        match &self.pool {
            Some(pool) => pool.broadcast(|ctx| f(ctx.index())),
            None => vec![f(0)],
        }
    }

    /// Runs `f` on tracer `tracer` alone and returns what it returns.
    pub fn on<R: Send>(&self, tracer: usize, f: impl FnOnce() -> R + Send) -> R {
        if self.pool.is_none() {
            return f();
        }
        let f = Mutex::new(Some(f));
        let mut results = self.each(|i| match i == tracer {
            true => f.lock().unwrap_or_else(|p| p.into_inner()).take().map(|f| f()),
            false => None,
        });
        results.swap_remove(tracer % results.len()).expect("the tracer named ran the call")
    }

    /// Runs `f` on each of `items` on the tracer `tracer_of` names for it, the tracers side by
    /// side (each taking its items in their order); returns the results in the order of
    /// `items`.
    pub fn map<T: Send, R: Send>(&self, items: &mut [T], tracer_of: impl Fn(&T) -> usize, f: impl Fn(&mut T) -> R + Sync) -> Vec<R> {
        let count = self.count();
        let mut shares: Vec<Vec<(usize, &mut T)>> = (0..count).map(|_| Vec::new()).collect();
        for (at, item) in items.iter_mut().enumerate() {
            let tracer = tracer_of(item) % count;
            shares[tracer].push((at, item));
        }
        let shares: Vec<Mutex<Vec<(usize, &mut T)>>> = shares.into_iter().map(Mutex::new).collect();
        let done = self.each(|i| {
            let mut share = shares[i].lock().unwrap_or_else(|p| p.into_inner());
            share.iter_mut().map(|(at, item)| (*at, f(item))).collect::<Vec<_>>()
        });
        let mut out: Vec<Option<R>> = (0..items.len()).map(|_| None).collect();
        for (at, r) in done.into_iter().flatten() {
            out[at] = Some(r);
        }
        out.into_iter().map(|r| r.expect("every item ran on its tracer")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread_id() -> libc::pid_t {
        nix::unistd::gettid().as_raw()
    }

    #[test]
    fn one_tracer_is_the_calling_thread() {
        let tracers = Tracers::new(1).unwrap();
        assert_eq!(tracers.count(), 1);
        assert_eq!(tracers.each(|_| thread_id()), vec![thread_id()]);
        assert_eq!(tracers.on(0, thread_id), thread_id());
        let mut items = vec![1, 2, 3];
        assert_eq!(tracers.map(&mut items, |_| 0, |n| (*n, thread_id())), vec![(1, thread_id()), (2, thread_id()), (3, thread_id())]);
    }

    #[test]
    fn each_tracer_is_one_thread_for_its_life() {
        let tracers = Tracers::new(3).unwrap();
        let first = tracers.each(|_| thread_id());
        assert_eq!(first.len(), 3);
        for _ in 0..20 {
            assert_eq!(tracers.each(|_| thread_id()), first);
        }
        for (i, tid) in first.iter().enumerate() {
            assert_eq!(tracers.on(i, thread_id), *tid);
        }
    }

    #[test]
    fn map_keeps_the_order_and_runs_each_item_on_its_tracer() {
        let tracers = Tracers::new(2).unwrap();
        let ids = tracers.each(|_| thread_id());
        let mut items: Vec<usize> = (0..9).collect();
        let out = tracers.map(
            &mut items,
            |&n| n % 3,
            |n| {
                *n *= 10;
                (*n, thread_id())
            },
        );
        for (n, (value, tid)) in out.into_iter().enumerate() {
            assert_eq!(value, n * 10);
            assert_eq!(tid, ids[(n % 3) % 2], "item {n}");
        }
        assert_eq!(items, (0..9).map(|n| n * 10).collect::<Vec<_>>());
    }
}
