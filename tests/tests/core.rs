//! End-to-end tests on the C test programs of tests/progs/: each is launched under ckpt,
//! checkpointed, crashed, restarted (see `tests::canonical_scenario`), and must finish with the
//! same RESULT as an uninterrupted run.

use std::path::Path;
use std::time::Duration;

use tests::*;

/// Seconds each program runs (uninterrupted): long enough for the scenario's checkpoints to
/// land mid-way (about 2.5 s of it is used before the last restart), short enough for the suite.
const SECONDS: &str = "5";
/// For the 256 MiB heaps: their first checkpoint writes and syncs all of it while the reference
/// run and the other test of the pair fill theirs, which on a loaded machine's disk takes
/// seconds, and the job must still run after it.
const HEAVY_SECONDS: &str = "8";

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn compute() {
    canonical_scenario(&Case::new("compute", |_| vec![os(prog("compute")), os(SECONDS)]));
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn compute_static() {
    canonical_scenario(&Case::new("compute-static", |_| vec![os(prog("compute-static")), os(SECONDS)]));
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn threads() {
    canonical_scenario(&Case::new("threads", |_| vec![os(prog("threads")), os(SECONDS)]));
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn threads_static() {
    canonical_scenario(&Case::new("threads-static", |_| vec![os(prog("threads-static")), os(SECONDS)]));
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn bigheap() {
    let case = Case::new("bigheap", |work: &Path| vec![os(prog("bigheap")), os(work.join("out.txt")), os(HEAVY_SECONDS), os("256")]).compare_file("out.txt");
    canonical_scenario(&case);
}

/// The same heap compressed (`--compress zstd:1`): its random segments are stored raw (the
/// samples do not compress), its regular ones compressed, so one stream mixes both codecs; the
/// restarts must read both.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn bigheap_compressed() {
    let case = Case::new("bigheap-zstd", |work: &Path| vec![os(prog("bigheap")), os(work.join("out.txt")), os(HEAVY_SECONDS), os("256")])
        .compare_file("out.txt")
        .launch_options(&["--compress", "zstd:1"])
        .check_image(|dir| {
            // Bytes 12..16 of a chunk file's header: its codec (0 none, 1 zstd).
            let codecs: std::collections::BTreeSet<u32> = chunk_files(dir)
                .iter()
                .map(|f| {
                    let head = std::fs::read(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
                    u32::from_le_bytes(head[12..16].try_into().expect("a chunk header"))
                })
                .collect();
            assert_eq!(codecs, [0, 1].into(), "bigheap-zstd: expected raw and zstd chunks, found codecs {codecs:?}");
        });
    canonical_scenario(&case);
}

/// A checkpoint copies private memory while the job runs: before the freeze, its writes
/// tracked (`--copy-memory ahead`, the default), or after the release, from a copy of each
/// process forked at the freeze (`later`). The program must not notice (it checks itself: no
/// SIGCHLD, no stranger in waitpid, no pipe end kept open elsewhere); after each checkpoint the
/// copy is gone, not even a zombie left; and the memory restored is the memory at the freeze
/// though the program rewrote it as it was copied (its RESULT and running sum).
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn memory_copied_while_the_job_runs_goes_unnoticed() {
    at_once(&["ahead", "later"], |copy| copied_while_running(copy));
}

fn copied_while_running(copy: &str) {
    let case = Case::new("copylater", |_| vec![os(prog("copylater")), os("6")]);
    let sb = Sandbox::new(&format!("{}-{copy}", case.name));
    let work = sb.mkdir("work");
    let argv = case.argv(&work);
    let reference = Reference::start(&argv, &sb.path("reference.out"));
    let mut job = Job::launch_with(&sb.dir, &["--copy-memory", copy], &argv, &sb.path("launch.out"));
    job.wait_for_line("START", Duration::from_secs(30));
    let program = job_processes(&sb.dir)
        .into_iter()
        .find(|&pid| comm(pid) == "copylater" && comm(parent(pid)) != "copylater")
        .unwrap_or_else(|| panic!("copylater: the program is not among the job's processes\n{}", job.report()));
    let own = children(program);
    assert_eq!(own.len(), 1, "copylater: expected the program's one child, found {own:?}");
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(500));
        let v = job.checkpoint(&[]);
        check_checkpoint_json(&v);
        // The heap (and what was rewritten of it since the last checkpoint) copied before the
        // freeze with `ahead`, never with `later`.
        // Before Linux 6.7 nothing is copied ahead, and the agent says why.
        let ahead = v["copied_ahead_bytes"].as_u64().unwrap_or_else(|| panic!("copylater: no copied_ahead_bytes in {v}"));
        let expected = copy == "ahead" && kernel_tracks_writes();
        assert_eq!(ahead >= 1 << 20, expected, "copylater --copy-memory {copy}: {ahead} bytes copied before the freeze");
        if copy == "ahead" && !kernel_tracks_writes() {
            assert!(job.errors().contains(NO_WRITE_TRACKING), "copylater: a kernel without PAGEMAP_SCAN, and nothing said\n{}", job.report());
        }
        assert_eq!(children(program), own, "copylater: after a checkpoint the program has other children than its own (a copy left, or a zombie)");
    }
    job.kill_launcher();
    let mut restarted = Job::restart(&sb.dir, &sb.path("restart.out"));
    assert_matches_reference(&case, &mut restarted, reference.output());
}

/// Shared memory objects (MAP_SHARED|MAP_ANONYMOUS, POSIX shared memory) are copied before
/// the freeze, and the freeze copies only what was written since: a job written without pause
/// comes back from each generation as it was frozen (each writer finds every page as it last
/// wrote it), whether the copy was used or given up (a child that wrote and ended between the
/// copy and the freeze, a memfd written with pwrite). The agent's debug lines say which: at least
/// one generation uses the copy of two objects (where the kernel tracks writes), the POSIX one
/// although a process also maps it read-only (a mapping the kernel refuses to track).
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn shared_memory_copied_before_the_freeze_restarts_as_it_was_frozen() {
    let case = Case::new("sharedwrites", |work| vec![os(prog("sharedwrites")), os(work), os("8")]);
    let sb = Sandbox::new("sharedwrites-ahead");
    let work = sb.mkdir("work");
    let argv = case.argv(&work);
    let reference = Reference::start(&case.argv(&sb.mkdir("ref-work")), &sb.path("reference.out"));
    let mut args = vec![os("launch"), os("--dir"), os(&sb.dir), os("--keep"), os("8"), os("--")];
    args.extend(argv.iter().cloned());
    let log = [("CKPT_LOG", "warn,ckpt_core::capture=debug")];
    let mut job = Job::start(&sb.dir, &sb.dir, &args, &log, &sb.path("launch.out"));
    job.wait_for_line("START", Duration::from_secs(30));
    let mut generations = Vec::new();
    // The program's short-lived children write during its first third (2.7 s): the first
    // generations give their copy up, the last ones use it.
    for _ in 0..6 {
        std::thread::sleep(Duration::from_millis(600));
        generations.push(check_checkpoint_json(&job.checkpoint(&[])));
    }
    job.kill_launcher();
    let said = strip_ansi(&job.errors());
    let used: Vec<u64> = said
        .lines()
        .filter(|l| l.contains("shared memory copied ahead settled"))
        .filter_map(|l| l.split("objects=").nth(1)?.split_whitespace().next()?.parse().ok())
        .collect();
    if kernel_tracks_writes() {
        assert_eq!(
            used.len(),
            generations.len(),
            "sharedwrites: one settling of the shared memory copied per checkpoint expected, found {used:?}\n{}",
            job.report()
        );
        assert!(used.contains(&2), "sharedwrites: no generation used the copy of the anonymous and POSIX objects: {used:?}\n{}", job.report());
        assert!(said.contains("a child of a process ended since"), "sharedwrites: the short-lived children were not seen\n{}", job.report());
    } else {
        assert!(used.is_empty(), "sharedwrites: a kernel without write tracking, and shared memory copied ahead: {used:?}");
    }
    // The fifth generation (its copy used) checked as it runs for a while (each writer checks
    // every page of its ring within 0.4 s), then the last to the end (the end unlinks the POSIX
    // object, which a restart of another generation would need).
    let fifth = generations[4].to_string();
    let mut restarted = Job::restart_with(&sb.dir, &["--generation", &fifth], &sb.path("restart-fifth.out"));
    std::thread::sleep(Duration::from_millis(2500));
    assert!(restarted.try_wait().is_none(), "sharedwrites: generation {fifth} ended early\n{}", restarted.report());
    assert!(fail_lines(&restarted.output()).is_empty(), "sharedwrites: generation {fifth}\n{}", restarted.report());
    restarted.kill_launcher();
    let mut restarted = Job::restart(&sb.dir, &sb.path("restart-last.out"));
    assert_matches_reference(&case, &mut restarted, reference.output());
}

/// Text without its terminal colour sequences (`ESC [ ... m`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// After a full generation, the next ones store only the pages the program wrote since the one
/// before and refer to earlier generations for the rest: the second stores at most 15 % of what
/// the first did; the third (1 <- 2 <- 3) restarts with every page from the generation that
/// holds it (the program's running sum matches its heap); `--keep 2` keeps generation 1 while
/// 3 needs it; `verify` checks the chain, and a damaged chunk of generation 1 makes both
/// `verify` of 3 and the restart of 3 refuse, naming the file.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn incremental_generations_store_what_changed_and_restart_from_the_chain() {
    let case = Case::new("slicewrite", |_| vec![os(prog("slicewrite")), os("8"), os("256")]);
    let reference_sb = Sandbox::new(&case.name);
    let work = reference_sb.mkdir("work");
    let argv = case.argv(&work);
    let reference = Reference::start(&argv, &reference_sb.path("reference.out"));
    // The pages written since the base copied before the freeze (the default), from a fork
    // after the release, and while frozen (what a checkpoint does when they are few next to the
    // process's memory: `fork_pays`).
    for copy in ["ahead", "later", "frozen"] {
        let sb = Sandbox::new(&format!("{}-{copy}", case.name));
        incremental_chain(&case, &sb, &argv, reference.output(), copy);
    }
}

fn incremental_chain(case: &Case, sb: &Sandbox, argv: &[std::ffi::OsString], reference: &str, copy: &str) {
    let mut job = Job::launch_with(&sb.dir, &["--keep", "2", "--copy-memory", copy], argv, &sb.path("launch.out"));
    job.wait_for_line("START", Duration::from_secs(30));
    let mut stored = Vec::new();
    // Before Linux 6.7 each generation is whole: two show it (three of 256 MiB outlast the
    // program under emulation, scripts/vm-check.sh).
    let generations = if kernel_tracks_writes() { 3 } else { 2 };
    let mut times = Vec::new();
    for _ in 0..generations {
        let asked = std::time::Instant::now();
        let v = job.checkpoint(&[]);
        times.push((asked, std::time::Instant::now()));
        stored.push(v["bytes_stored"].as_u64().unwrap_or_else(|| panic!("slicewrite: no bytes_stored in {v}")));
        std::thread::sleep(Duration::from_millis(1000));
    }
    // From the first checkpoint asked to the second one's end: the most the job can have run
    // between the two freezes.
    let span = times[1].1.duration_since(times[0].0);
    assert!(stored[0] >= 256 << 20, "slicewrite: the first generation stored {} bytes, less than the heap", stored[0]);
    if !kernel_tracks_writes() {
        // Before Linux 6.7: every generation whole, said once; the newest restarts alone.
        assert!(
            stored[1] >= 256 << 20,
            "slicewrite: a kernel without write tracking, and the second generation stored {} bytes, not the whole heap",
            stored[1]
        );
        assert_eq!(job.errors().matches(NO_WRITE_TRACKING).count(), 1, "slicewrite: the fallback should be said once\n{}", job.report());
        job.kill_launcher();
        let mut restarted = Job::restart(&sb.dir, &sb.path("restart.out"));
        assert_matches_reference(case, &mut restarted, reference);
        return;
    }
    // The program rewrites one slice of 16 every 1.5 s: what it can have written between the
    // two checkpoints grows with the time between them, longer on a loaded machine (a CI run
    // took 3 s and stored 3 slices). The whole heap would be 16.
    let slices = (span.as_secs_f64() / 1.5).ceil() as u64 + 1;
    assert!(
        stored[1] * 16 <= stored[0] * slices.min(15),
        "slicewrite: the second generation stored {} bytes of the first's {}, more than the {} slices of 16 written in {span:?}",
        stored[1],
        stored[0],
        slices
    );
    job.kill_launcher();
    let out = ckpt(&[os("inspect"), os(&sb.dir), os("--json")]);
    assert!(out.success(), "inspect: {out}");
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("inspect --json: {e}: {out}"));
    let needs: Vec<u64> = v["needs"].as_array().map(|a| a.iter().filter_map(|g| g.as_u64()).collect()).unwrap_or_default();
    assert_eq!(v["generation"], 3, "slicewrite: {out}");
    assert!(needs.first() == Some(&1), "slicewrite: generation 3 should read pages from generation 1, needs {needs:?}");
    assert!(sb.dir.join("gen-000001/MANIFEST").is_file(), "slicewrite: generation 1 was pruned while generation 3 needs it");
    let ok = verify(&sb.dir);
    assert!(ok.success() && ok.stdout.contains("incremental"), "slicewrite: verify of the chain: {ok}");

    let mut restarted = Job::restart(&sb.dir, &sb.path("restart.out"));
    assert_matches_reference(case, &mut restarted, reference);

    // Damaged chunks of generation 1 (which 3 reads from) are found by `verify` of 3 and make
    // its restart refuse, both naming a file; nothing of the job is left running. Every chunk
    // is damaged: which of them 3 still needs depends on what the program wrote meanwhile (a
    // chunk of what the freeze stored after the copy ahead may hold only pages written again
    // since).
    let node = v["nodes"][0]["node"].as_str().unwrap_or_else(|| panic!("slicewrite: no node in {out}"));
    let chunks = sb.dir.join("gen-000001").join(node).join("chunks");
    let names: Vec<String> = std::fs::read_dir(&chunks).unwrap().flatten().map(|e| damage_chunk(&e.path(), 0.5)).collect();
    let bad = verify(&sb.dir);
    assert!(!bad.success() && names.iter().any(|n| bad.to_string().contains(n)), "slicewrite: verify should name a damaged chunk of {names:?}: {bad}");
    let refused = ckpt(&[os("restart"), os("--dir"), os(&sb.dir)]);
    assert!(
        !refused.success() && names.iter().any(|n| refused.to_string().contains(n)),
        "slicewrite: the restart should refuse, naming a damaged chunk of {names:?}: {refused}"
    );
}

/// A program's own copies of the pages of its private file mappings (a library's data and its
/// relocated read-only data, a file mapped copy-on-write: tests/progs/filecopies.c) are tracked
/// as anonymous memory is: the first generation stores them (16 MiB here), the next ones only
/// those written since (at most 15 % of the first), whether they are copied before the freeze,
/// from a fork after the release, or while frozen; the file's own pages are never stored. The
/// restart from the third generation brings back every copy, copies of zeros as zeros, and
/// dropped copies as the file's bytes.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn copies_of_private_file_pages_are_stored_once_and_restart_from_the_chain() {
    let case = Case::new("filecopies", |work: &Path| vec![os(prog("filecopies")), os(work), os("8"), os("32")]);
    let reference_sb = Sandbox::new(&case.name);
    let reference = Reference::start(&case.argv(&reference_sb.mkdir("work")), &reference_sb.path("reference.out"));
    at_once(&["ahead", "later", "frozen"], |&copy| {
        let sb = Sandbox::new(&format!("{}-{copy}", case.name));
        let argv = case.argv(&sb.mkdir("work"));
        let mut job = Job::launch_with(&sb.dir, &["--keep", "2", "--copy-memory", copy], &argv, &sb.path("launch.out"));
        job.wait_for_line("START", Duration::from_secs(30));
        let mut stored = Vec::new();
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(1000));
            let v = job.checkpoint(&[]);
            stored.push(v["bytes_stored"].as_u64().unwrap_or_else(|| panic!("filecopies: no bytes_stored in {v}")));
        }
        assert!(stored[0] >= 16 << 20, "filecopies --copy-memory {copy}: the first generation stored {} bytes, less than the copies", stored[0]);
        // The file's pages are not the program's: 32 MiB of them would show here.
        assert!(stored[0] < 28 << 20, "filecopies --copy-memory {copy}: the first generation stored {} bytes: the file's own pages too?", stored[0]);
        if kernel_tracks_writes() {
            assert!(
                stored[1] * 100 <= stored[0] * 15 && stored[2] * 100 <= stored[0] * 15,
                "filecopies --copy-memory {copy}: generations stored {stored:?} bytes: the copies not written since the first were stored again"
            );
        }
        job.kill_launcher();
        let mut restarted = Job::restart(&sb.dir, &sb.path("restart.out"));
        assert_matches_reference(&case, &mut restarted, reference.output());
    });
}

/// `ckpt restart --lazy`: the job runs again before its memory is back, and everything it does
/// meanwhile (the kernel reading and writing pages not there yet, forks, dropped pages, moved
/// and remapped regions: tests/progs/lazytouch.c) sees the memory it had. A checkpoint asked
/// at once waits for the fill; a crash and a second lazy restart finish with the uninterrupted
/// answer. A damaged chunk found once the job runs ends it, naming the file. An ordinary
/// user's restart cannot be lazy: it says so and restarts eagerly, with the same outcomes.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn lazy_restart_serves_pages_while_the_job_runs() {
    let case = Case::new("lazytouch", |_| vec![os(prog("lazytouch")), os("6"), os("256")]);
    let sb = Sandbox::new(&case.name);
    let work = sb.mkdir("work");
    let argv = case.argv(&work);
    let reference = Reference::start(&argv, &sb.path("reference.out"));
    let mut job = Job::launch(&sb.dir, &argv, &sb.path("launch.out"));
    job.wait_for_line("START", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(1500));
    job.checkpoint(&["--kill"]);
    job.wait_killed();

    let lazy_restart = |out: &str| {
        let args = [os("restart"), os("--dir"), os(&sb.dir), os("--lazy")];
        Job::start(&sb.dir, &sb.dir, &args, &[("CKPT_LOG", "ckpt_core::lazy=info")], &sb.path(out))
    };
    let was_lazy = |job: &Job| {
        let err = job.errors();
        if jobs_as_root() {
            // Said as the job is released, before its memory is all back. (The fill's end is
            // said too, unless the job ends first and the restart with it.)
            assert!(err.contains("lazy restart: the job runs"), "lazytouch: the restart should have been lazy\n{}", job.report());
        } else {
            assert!(err.contains("not lazy"), "lazytouch: an ordinary user's restart should say it is not lazy\n{}", job.report());
        }
    };
    let mut first = lazy_restart("restart1.out");
    first.checkpoint(&[]);
    first.kill_launcher();
    was_lazy(&first);
    let mut last = lazy_restart("restart2.out");
    assert_matches_reference(&case, &mut last, reference.output());
    was_lazy(&last);

    // Damaged chunks: every chunk of every generation kept, each at nine places. Which chunks
    // the restart still reads depends on what the program wrote meanwhile (the largest may hold
    // only pages copied before the freeze and stored again after, which no restart reads: seen
    // twice on a loaded machine, once in CI), so every one is damaged and the failure must name
    // one of them.
    let mut names = Vec::new();
    for generation in std::fs::read_dir(&sb.dir).unwrap().flatten().filter(|e| e.file_name().to_string_lossy().starts_with("gen-")) {
        for node in std::fs::read_dir(generation.path()).unwrap().flatten().filter(|e| e.path().join("chunks").is_dir()) {
            for chunk in std::fs::read_dir(node.path().join("chunks")).unwrap().flatten() {
                for tenth in 1..10 {
                    damage_chunk(&chunk.path(), f64::from(tenth) / 10.0);
                }
                names.push(chunk.file_name().to_string_lossy().into_owned());
            }
        }
    }
    assert!(!names.is_empty(), "lazytouch: no chunk file under {}", sb.dir.display());
    let mut damaged = lazy_restart("damaged.out");
    let status = damaged.wait_timeout(Duration::from_secs(60));
    assert!(!status.success(), "lazytouch: a restart from a damaged chunk should fail\n{}", damaged.report());
    let errors = damaged.errors();
    assert!(names.iter().any(|n| errors.contains(n)), "lazytouch: the failure should name a damaged chunk of {names:?}\n{}", damaged.report());
    assert!(result_line(&damaged.output()).is_none(), "lazytouch: the job should not have finished\n{}", damaged.report());
    wait_job_gone(&sb.dir, Duration::from_secs(10), "a lazy restart ended by a damaged chunk");
}

/// The children of process `pid`, zombies included.
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten() {
        let listed = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        out.extend(listed.split_whitespace().filter_map(|c| c.parse::<u32>().ok()));
    }
    out.sort_unstable();
    out
}

fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim().to_string()
}

fn parent(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(") ").and_then(|(_, rest)| rest.split_whitespace().nth(1)).and_then(|p| p.parse().ok()).unwrap_or(0)
}

/// `ckpt run` launches the program while the directory holds no checkpoint, and restarts the job
/// from its newest checkpoint once it does: a batch script's one command, run again after a
/// crash, continues the work instead of starting it over.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn run_launches_first_then_restarts_from_the_newest_checkpoint() {
    let case = Case::new("run", |_| vec![os(prog("compute")), os("6")]);
    let sb = Sandbox::new(&case.name);
    let work = sb.mkdir("work");
    let argv = case.argv(&work);
    let reference = Reference::start(&argv, &sb.path("reference.out"));
    let mut args = vec![os("run"), os("--dir"), os(&sb.dir), os("--")];
    args.extend(argv.iter().cloned());

    let mut first = Job::start(&sb.dir, &sb.dir, &args, &[], &sb.path("run1.out"));
    first.wait_for_line("START", Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(1));
    first.checkpoint(&[]);
    std::thread::sleep(Duration::from_secs(1));
    first.kill_launcher();
    let said = read_text(&first.stderr);
    assert!(said.contains("no checkpoint in"), "the first `ckpt run` did not say it launches: {said}");

    let mut second = Job::start(&sb.dir, &sb.dir, &args, &[], &sb.path("run2.out"));
    second.wait();
    let said = read_text(&second.stderr);
    assert!(said.contains("restarting the job from its newest checkpoint"), "the second `ckpt run` did not say it restarts: {said}");
    assert_not_rerun(&second);
    assert_matches_reference(&case, &mut second, reference.output());
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn state() {
    let case = Case::new("state", |work: &Path| vec![os(prog("state")), os(work), os(SECONDS)]).compare_file("state-data.bin");
    canonical_scenario(&case);
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn mmaps() {
    let case = Case::new("mmaps", |work: &Path| vec![os(prog("mmaps")), os(work), os(SECONDS)])
        .compare_file("mmaps-shared.dat")
        .compare_file("mmaps-private.dat")
        // It writes its shared file mapping every step: without --protect, a restart after a crash
        // would be refused (the file is newer than the memory).
        .protect_work();
    canonical_scenario(&case);
}

/// Guard pages (madvise MADV_GUARD_INSTALL; glibc 2.42 puts one at the end of every thread
/// stack, so every threaded program of such a system holds some; zdtm's maps12) come back
/// guards, in anonymous memory, a thread's stack and a private file mapping: tests/progs/guards.c
/// writes into each at its end, which must fault, and beside each, which must not, after
/// restarts from a full and from an incremental generation. Before, such a checkpoint was
/// refused; a restart that left the guards out fails the program's check (seen: "a write
/// passed: the guard is gone").
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
#[cfg_attr(ckpt_no_guard_scan, ignore = "the kernel (before 6.16) does not name guard pages to PAGEMAP_SCAN: refused (errors.rs)")]
fn guard_pages_come_back_guards() {
    let case = Case::new("guards", |work: &Path| vec![os(prog("guards")), os(SECONDS), os(work)]);
    canonical_scenario(&case);
}

/// checkpoint --kill and restart, 5 times in a row, on the threads program; then it finishes.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn five_rounds_threads() {
    let sb = Sandbox::new("five-rounds");
    let argv = vec![os(prog("threads")), os("6")];
    let reference = Reference::start(&argv, &sb.path("reference.out"));

    let mut job = Job::launch(&sb.dir, &argv, &sb.path("launch.out"));
    job.wait_for_line("START", Duration::from_secs(30));
    thread_sleep_ms(500);
    let mut generations = Vec::new();
    let mut restarts = Vec::new();
    for round in 1..=5 {
        thread_sleep_ms(400);
        let g = check_checkpoint_json(&job.checkpoint(&["--kill"]));
        if let Some(&prev) = generations.last() {
            assert!(g > prev, "round {round}: generation {g} after {prev}");
        }
        generations.push(g);
        job.wait_killed();
        job = Job::restart(&sb.dir, &sb.path(&format!("restart{round}.out")));
        restarts.push(job.stdout.clone());
    }
    let case = Case::new("five-rounds", |_| Vec::new());
    assert_matches_reference(&case, &mut job, reference.output());
    for out in &restarts {
        assert!(!has_line(&read_text(out), "START"), "{} has START: a restart ran the program from its beginning\n{}", out.display(), sb.report());
    }
}

/// One generation restarted twice (and the original job, checkpointed without --kill, finishes
/// too): all three runs end with the reference RESULT.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn one_image_restarted_twice() {
    let sb = Sandbox::new("twice");
    let argv = vec![os(prog("compute")), os("4")];
    let case = Case::new("twice", |_| Vec::new());

    std::thread::scope(|scope| {
        let reference = scope.spawn(|| reference_run(&argv, &sb.path("reference.out")));

        let mut original = Job::launch(&sb.dir, &argv, &sb.path("launch.out"));
        original.wait_for_line("START", Duration::from_secs(30));
        thread_sleep_ms(1000);
        let g = check_checkpoint_json(&original.checkpoint(&[]));
        let reference = reference.join().unwrap().unwrap_or_else(|e| panic!("{e}"));
        // the checkpointed job goes on undisturbed
        assert_matches_reference(&case, &mut original, &reference);
        wait_job_gone(&sb.dir, EXIT_TIMEOUT, "the original job ended");

        let mut first = Job::restart_with(&sb.dir, &["--keep-files"], &sb.path("restart1.out"));
        assert_matches_reference(&case, &mut first, &reference);
        assert_not_rerun(&first);
        wait_job_gone(&sb.dir, EXIT_TIMEOUT, "the first restarted job ended");

        let generation = g.to_string();
        let mut second = Job::restart_with(&sb.dir, &["--generation", &generation], &sb.path("restart2.out"));
        assert_matches_reference(&case, &mut second, &reference);
        assert_not_rerun(&second);
    });
}

fn thread_sleep_ms(ms: u64) {
    std::thread::sleep(Duration::from_millis(ms));
}

/// Credentials come back as they were, in every thread: the restarted program checks its uids,
/// gids, groups and capability sets each step (a restart must not leave it the restorer's), and
/// keeps creating files that belong to the user who launched it (root, or in the run as an
/// ordinary user, that user: the job's user namespace maps them to themselves).
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn credentials_and_file_owner() {
    use std::os::unix::fs::MetadataExt;
    let sb = Sandbox::new("creds");
    let work = sb.mkdir("run");
    let argv = vec![os(prog("creds")), os(&work), os(SECONDS)];
    let (uid, gid) = test_user().map(|u| (u.uid, u.gid)).unwrap_or((0, 0));

    let mut launch = Job::launch(&sb.dir, &argv, &sb.path("launch.out"));
    launch.wait_for_line("START", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(1000));
    assert!(has_line(&launch.output(), &format!("IDS {uid} {gid}")), "the job does not run with the user's own ids\n{}", launch.report());
    launch.checkpoint(&["--kill"]);
    launch.wait_killed();

    let mut restarted = Job::restart(&sb.dir, &sb.path("restart.out"));
    std::thread::sleep(Duration::from_millis(800));
    let g = check_checkpoint_json(&restarted.checkpoint(&["--kill"]));
    assert!(g >= 2, "second generation {g}");
    restarted.wait_killed();

    let mut last = Job::restart(&sb.dir, &sb.path("restart2.out"));
    let status = last.wait();
    assert!(status.success(), "the restarted job failed\n{}", last.report());
    let out = last.output();
    assert!(has_line(&out, "PASS") && fail_lines(&out).is_empty(), "credentials changed across a restart\n{}", last.report());
    assert_not_rerun(&last);
    let meta = std::fs::metadata(work.join("owned.txt")).expect("the restarted job wrote owned.txt");
    assert_eq!((meta.uid(), meta.gid()), (uid, gid), "a file the restarted job created belongs to someone else");
}

/// A job started by root that dropped to another user (uids, gids, supplementary groups, no
/// capabilities, no_new_privs) comes back as that user, not as the root who restarts it: the
/// program checks its credentials every step, and the files it creates after the restart belong
/// to that user. Root only by its nature (only root can drop to another user).
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn credentials_of_a_job_that_dropped_to_another_user() {
    needs_root("only root can start a job that drops to another user");
    use std::os::unix::fs::MetadataExt;
    let sb = Sandbox::new("creds-drop");
    let work = sb.mkdir("run");
    let (uid, gid) = (65534u32, 65534u32);
    std::os::unix::fs::chown(&work, Some(uid), Some(gid)).unwrap();
    let argv = vec![
        os("setpriv"),
        os(format!("--reuid={uid}")),
        os(format!("--regid={gid}")),
        os("--groups=100,65534"),
        os("--inh-caps=-all"),
        os("--no-new-privs"),
        os("--"),
        os(prog("creds")),
        os(&work),
        os(SECONDS),
    ];
    let mut launch = Job::launch(&sb.dir, &argv, &sb.path("launch.out"));
    launch.wait_for_line("START", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(1000));
    assert!(has_line(&launch.output(), &format!("IDS {uid} {gid}")), "{}", launch.report());
    launch.checkpoint(&["--kill"]);
    launch.wait_killed();

    let mut restarted = Job::restart(&sb.dir, &sb.path("restart.out"));
    std::thread::sleep(Duration::from_millis(800));
    restarted.checkpoint(&["--kill"]);
    restarted.wait_killed();

    let mut last = Job::restart(&sb.dir, &sb.path("restart2.out"));
    let status = last.wait();
    let out = last.output();
    assert!(status.success() && has_line(&out, "PASS") && fail_lines(&out).is_empty(), "credentials changed across a restart\n{}", last.report());
    assert_not_rerun(&last);
    let meta = std::fs::metadata(work.join("owned.txt")).expect("the restarted job wrote owned.txt");
    assert_eq!((meta.uid(), meta.gid()), (uid, gid), "a file the restarted job created belongs to someone else");
}

/// A daemon's start (issue 33): root starts the program from a directory only root may read; it
/// opens a root-only file (read-only, and maps it) and a root-only log (appending), then drops to
/// another user for good (tests/progs/dropprivs.c). Checkpoint, crash, root's restart: the
/// program must come back as that user with those descriptors and that mapping working (it
/// checks them every step, and that it cannot open the file anew), although that user could open
/// none of them now, with the lower limits it set itself (where root lacks CAP_SYS_RESOURCE, as
/// on this project's machines and in containers, the capture once read none and the restart gave
/// the job root's), and after a second round finish with the answer and the log of an
/// uninterrupted run. Root only by its nature.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_job_that_dropped_to_another_user_keeps_what_it_opened_as_root() {
    needs_root("only root can start a job that drops to another user");
    use std::os::unix::fs::PermissionsExt;
    let private = Sandbox::new("dropprivs-bin");
    let bin_dir = private.mkdir("root-only");
    std::fs::set_permissions(&bin_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let bin = bin_dir.join("dropprivs");
    copy_program(&prog("dropprivs"), &bin);
    canonical_scenario(&Case::new("dropprivs", move |work| vec![os(&bin), os(work), os("65534"), os("65534"), os(SECONDS)]).compare_file("held.log"));
}

/// An image that an ordinary user wrote, restarted by root: the job comes back as that user
/// (ids, no capabilities, the files it creates are theirs), never as root.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn root_restarts_a_users_image_as_that_user() {
    needs_harness_root();
    use std::os::unix::fs::MetadataExt;
    let sb = Sandbox::new("root-restarts-user");
    let work = sb.mkdir("run");
    // The run's ordinary user, or nobody when the jobs run as root.
    let (uid, gid) = test_user().map(|u| (u.uid, u.gid)).unwrap_or((65534, 65534));
    for p in [sb.path(""), work.clone()] {
        std::os::unix::fs::chown(&p, Some(uid), Some(gid)).unwrap();
    }
    let args = [os("launch"), os("--dir"), os(&sb.dir), os("--"), os(prog("creds")), os(&work), os(SECONDS)];
    let mut launch = Job::start_as(uid, gid, &sb.dir, &args, &sb.path("launch.out"));
    launch.wait_for_line("START", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(1000));
    launch.checkpoint(&["--kill"]);
    launch.wait_killed();

    // root's own restart, not the run's user's
    let restart = [os("restart"), os("--dir"), os(&sb.dir)];
    let mut restarted = Job::start_as(0, 0, &sb.dir, &restart, &sb.path("restart.out"));
    let status = restarted.wait();
    let out = restarted.output();
    assert!(status.success() && has_line(&out, "PASS") && fail_lines(&out).is_empty(), "the job did not come back as its user\n{}", restarted.report());
    let meta = std::fs::metadata(work.join("owned.txt")).expect("the restarted job wrote owned.txt");
    assert_eq!((meta.uid(), meta.gid()), (uid, gid), "root's restart of a user's image made files as someone else");
}

/// Nice values, scheduling policy, CPU affinity, timer slack, names and parent-death signals of
/// two threads, oom_score_adj, THP disabled, personality, umask, a resource limit, no_new_privs
/// and the child-subreaper flag all come back; the program checks them every step.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn process_and_thread_attributes() {
    canonical_scenario(&Case::new("attrs", |_| vec![os(prog("attrs")), os(SECONDS)]));
}

/// The capture asks a process what only the process can tell (handlers, interval timers, prctl
/// values, each thread's signal stack...) in one stop per thread, not two ptrace stops per
/// question: counted in the capture's debug log, which a busy machine does not change. A process
/// that ignores SIGTRAP cannot be asked so (ptrace/batch.rs) and is asked one call at a time. A
/// process that denies itself memory both writable and executable (PR_SET_MDWE, systemd's
/// MemoryDenyWriteExecute) is asked in one stop too, and comes back denied. All come back with
/// every attribute `attrs` checks.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
#[cfg_attr(ckpt_no_mdwe, ignore = "this kernel has no PR_SET_MDWE (Linux 6.3)")]
fn a_process_is_asked_in_one_stop_per_thread() {
    let stops = at_once(&["trap-free", "trap-ignored", "mdwe"], |&how| {
        let case = Case::new(&format!("attrs-{how}"), move |_| vec![os(prog("attrs")), os(SECONDS), os(how)]);
        let sb = Sandbox::new(&case.name);
        let argv = case.argv(&sb.mkdir("work"));
        let reference = Reference::start(&argv, &sb.path("reference.out"));
        let mut args = vec![os("launch"), os("--dir"), os(&sb.dir), os("--")];
        args.extend(argv);
        let env = [("CKPT_LOG", "ckpt_core::capture=debug"), ("NO_COLOR", "1")];
        let mut job = Job::start(&sb.dir, &sb.dir, &args, &env, &sb.path("launch.out"));
        job.wait_for_line("START", Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(500));
        job.checkpoint(&["--kill"]);
        job.wait_killed();
        let counted: Vec<u32> = job
            .errors()
            .lines()
            .filter(|l| l.contains("process captured"))
            .filter_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("stops="))?.parse().ok())
            .collect();
        assert_eq!(counted.len(), 1, "{how}: one process captured, with its stops counted\n{}", job.report());
        let mut restarted = Job::restart(&sb.dir, &sb.path("restart.out"));
        assert_matches_reference(&case, &mut restarted, reference.output());
        counted[0]
    });
    eprintln!("ptrace stops of the capture: {} with the runner, {} one call at a time, {} under MDWE", stops[0], stops[1], stops[2]);
    // Two threads: the scratch area mapped, the runner placed and the area unmapped (one stop
    // each, single-stepped), one stop per thread; at most twice that if the calls took two.
    assert!(stops[0] <= 10, "two threads asked in {} ptrace stops: the questions are not batched", stops[0]);
    // One call at a time: two stops for each of some twenty questions.
    assert!(stops[1] >= stops[0] + 30, "a process ignoring SIGTRAP asked in {} stops, one using the runner in {}", stops[1], stops[0]);
    assert!(stops[2] <= 10, "a process under MDWE asked in {} ptrace stops: the runner was not placed", stops[2]);
}

/// Locked memory (mlock, mlock2 MLOCK_ONFAULT, mlockall MCL_FUTURE with and without
/// MCL_ONFAULT), madvise flags (DONTFORK, WIPEONFORK, DONTDUMP, HUGEPAGE, NOHUGEPAGE, SEQUENTIAL,
/// RANDOM) on their ranges, and membarrier registrations (private expedited, sync-core, rseq,
/// global) come back in a process and its child; the program checks them every step from
/// /proc/self/smaps, with forks (a wiped range is zero in a child, a DONTFORK one absent) and
/// membarrier calls.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn locked_memory_madvise_and_membarrier() {
    canonical_scenario(&Case::new("memattrs", |_| vec![os(prog("memattrs")), os(SECONDS)]));
}

/// MAP_DROPPABLE memory (glibc's vDSO getrandom state) comes back droppable and dropped, never
/// with the bytes it had (two restarts of one image would otherwise share a random state), and
/// MADV_WIPEONFORK memory beside it keeps its bytes and its flag; children forked before the
/// checkpoint and after the restart see both wiped (tests/progs/droppable.c, CRIU's maps11).
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
#[cfg_attr(ckpt_no_droppable, ignore = "this kernel has no MAP_DROPPABLE (Linux 6.11)")]
fn droppable_memory_comes_back_dropped() {
    canonical_scenario(&Case::new("droppable", |_| vec![os(prog("droppable")), os(SECONDS)]));
}

/// The mmap flags that stay with a mapping come back: a 256 GiB MAP_NORESERVE reservation (the
/// kernel's overcommit heuristic refuses it without the flag on a machine with less RAM and
/// swap, so the restart failed when it mapped it back plainly) with a few scattered pages
/// written, and a MAP_GROWSDOWN region of the program's own that it keeps extending by writing
/// below it. The program checks the pages (written ones hold their pattern, untouched ones read
/// zero) every step and the flags (`nr`, `gd`) from /proc/self/smaps.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn noreserve_and_growsdown_mappings() {
    canonical_scenario(&Case::new("noreserve", |_| vec![os(prog("noreserve")), os(SECONDS)]));
}

/// A reservation of 256 GiB with 64 pages written (tests/progs/noreserve.c) is not tracked for
/// writes whole: tracking puts a marker in the page tables for every page of a range, which
/// gave this program 513 MiB of page tables and froze it 1.9 s. The program checks its page
/// tables (VmPTE) after a checkpoint that lets it run on; the failure it would count is in
/// the memory the second checkpoint takes, so the restarted run reports it.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_sparse_reservation_keeps_small_page_tables() {
    let case = Case::new("noreserve-tables", |_| vec![os(prog("noreserve")), os("6")]);
    let sb = Sandbox::new(&case.name);
    let work = sb.mkdir("work");
    let argv = case.argv(&work);
    let reference = Reference::start(&argv, &sb.path("reference.out"));
    let mut job = Job::launch(&sb.dir, &argv, &sb.path("launch.out"));
    job.wait_for_line("START", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(500));
    job.checkpoint(&[]);
    // The program looks at its page tables every 80 ms.
    std::thread::sleep(Duration::from_millis(1000));
    job.checkpoint(&["--kill"]);
    job.wait_killed();
    let mut restarted = Job::restart(&sb.dir, &sb.path("restart.out"));
    assert_matches_reference(&case, &mut restarted, reference.output());
}

/// Calls that a stop alone ends with EINTR (epoll_wait, epoll_pwait, semtimedop, sigtimedwait,
/// recv and accept on sockets with SO_RCVTIMEO), each waiting again and again with a short
/// timeout: checkpointed many times, crashed, restarted, checkpointed again and restarted, the
/// program never sees EINTR or a timeout that comes early (it prints FAIL for each; 3 checkpoints
/// made 18 of them before the fix), and its sockets' waits still end (their timeouts came back).
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn calls_a_stop_ends_with_eintr_never_see_a_checkpoint() {
    let case = Case::new("eintr", |_| vec![os(prog("eintr")), os("12")]);
    let sb = Sandbox::new(&case.name);
    let work = sb.mkdir("work");
    let (reference, mut launch) = launch_and_checkpoint_many(&sb, &case, &work, 8, Duration::from_millis(150));
    assert!(!launch.output().contains("FAIL"), "a checkpoint was seen\n{}", launch.report());
    launch.kill_launcher();

    restart_checkpoint_kill_and_finish(&sb, &case, reference.output(), 5, Duration::from_millis(150));
}

/// CLOCK_MONOTONIC and CLOCK_BOOTTIME go on across restarts as if the job had never been down:
/// crashed after a checkpoint and restarted 6 s later, then checkpointed with `--kill` and
/// restarted 4 s later (the first restart's time namespace offsets counted in the second
/// checkpoint), the program never sees a clock jump or go back between two of its 10 ms steps,
/// through the vdso or the system call, and its absolute CLOCK_MONOTONIC timer fires on time.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn clocks_continue_across_restarts() {
    let case = Case::new("clocks", |_| vec![os(prog("clocks")), os("6")]);
    let sb = Sandbox::new(&case.name);
    let work = sb.mkdir("work");
    let argv = case.argv(&work);
    std::thread::scope(|scope| {
        let reference = scope.spawn(|| reference_run(&argv, &sb.path("reference.out")));
        let mut launch = Job::launch(&sb.dir, &argv, &sb.path("launch.out"));
        launch.wait_for_line("START", Duration::from_secs(30));
        thread_sleep_ms(1000);
        launch.checkpoint(&[]);
        thread_sleep_ms(500);
        launch.kill_launcher();
        assert!(fail_lines(&launch.output()).is_empty(), "a checkpoint was seen\n{}", launch.report());

        thread_sleep_ms(6000);
        let mut first = Job::restart(&sb.dir, &sb.path("restart1.out"));
        thread_sleep_ms(1000);
        first.checkpoint(&["--kill"]);
        first.wait_killed();
        assert!(fail_lines(&first.output()).is_empty(), "the clocks jumped at the first restart\n{}", first.report());

        thread_sleep_ms(4000);
        let mut second = Job::restart(&sb.dir, &sb.path("restart2.out"));
        let reference = reference.join().unwrap().unwrap_or_else(|e| panic!("{e}"));
        assert_matches_reference(&case, &mut second, &reference);
        assert_not_rerun(&second);
    });
}

/// A restart on a kernel whose vdso differs from the one the job started with (its functions at
/// other offsets, its data pages of another layout, as after a kernel upgrade or on another
/// machine), forced on this kernel by `CKPT_TEST_VDSO=proxy`: the job's vdso functions, whose
/// addresses glibc keeps, are reached through jumps at their old place to the new kernel's.
/// vdsoloop's second thread lives inside the vdso, so the checkpoints find it there and step it
/// out. The restarted job's [vdso] is elsewhere ("VDSO moved"), its clocks, gettimeofday, time
/// and getcpu still answer right, and a second restart, from a checkpoint of the proxied job,
/// chains: the answer is the uninterrupted run's. The threads' extended registers go through
/// the move to another CPU's layout too (`CKPT_TEST_XSTATE=move`: here the same layout).
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn the_vdso_of_another_kernel_is_reached_through_jumps_at_the_old_place() {
    // Long enough for nine checkpoints and a restart under software emulation too, where a
    // checkpoint takes 1-2 s (scripts/vm-check.sh runs this test on Linux 6.1 in QEMU: with 12 s
    // the program ended there before the restarted job's first checkpoint).
    let case = Case::new("vdsoloop", |_| vec![os(prog("vdsoloop")), os("20")]);
    let sb = Sandbox::new(&case.name);
    let work = sb.mkdir("work");
    let argv = case.argv(&work);
    let restart = |out: &str| {
        let args = [os("restart"), os("--dir"), os(&sb.dir)];
        Job::start(&sb.dir, &sb.dir, &args, &[("CKPT_TEST_VDSO", "proxy"), ("CKPT_TEST_XSTATE", "move"), ("CKPT_LOG", "info")], &sb.path(out))
    };
    std::thread::scope(|scope| {
        let reference = scope.spawn(|| reference_run(&argv, &sb.path("reference.out")));
        let mut launch = Job::launch(&sb.dir, &argv, &sb.path("launch.out"));
        launch.wait_for_line("START", Duration::from_secs(30));
        for _ in 0..4 {
            thread_sleep_ms(200);
            launch.checkpoint(&[]);
        }
        launch.checkpoint(&["--kill"]);
        launch.wait_killed();

        let mut first = restart("restart1.out");
        thread_sleep_ms(1000);
        for _ in 0..3 {
            first.checkpoint(&[]);
            thread_sleep_ms(200);
        }
        first.checkpoint(&["--kill"]);
        first.wait_killed();
        assert!(first.errors().contains("reached through jumps at their old place"), "the restart did not put the proxy in place\n{}", first.report());
        assert!(fail_lines(&first.output()).is_empty(), "the job saw its vdso calls go wrong\n{}", first.report());

        let mut second = restart("restart2.out");
        let reference = reference.join().unwrap().unwrap_or_else(|e| panic!("{e}"));
        assert_matches_reference(&case, &mut second, &reference);
        assert!(has_line(&second.output(), "VDSO moved"), "the restarted job's vdso did not move\n{}", second.report());
        assert_not_rerun(&second);
    });
}

/// `ckpt restart --clocks-jump` keeps the machine's clocks: the same program, restarted 6 s
/// after its checkpoint, sees them jump (what the test above would see without the time
/// namespace).
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn clocks_jump_across_a_restart_with_clocks_jump() {
    let sb = Sandbox::new("clocks-jump");
    let argv = [os(prog("clocks")), os("6")];
    let mut launch = Job::launch(&sb.dir, &argv, &sb.path("launch.out"));
    launch.wait_for_line("START", Duration::from_secs(30));
    thread_sleep_ms(1000);
    launch.checkpoint(&["--kill"]);
    launch.wait_killed();

    thread_sleep_ms(6000);
    let mut restarted = Job::restart_with(&sb.dir, &["--clocks-jump"], &sb.path("restart.out"));
    let status = restarted.wait();
    let out = restarted.output();
    let jumps = fail_lines(&out).into_iter().filter(|l| l.contains("CLOCK_MONOTONIC (vdso) jumped by")).count();
    assert!(!status.success() && jumps == 1, "the job did not see its clocks jump\n{}", restarted.report());
    assert_not_rerun(&restarted);
}
