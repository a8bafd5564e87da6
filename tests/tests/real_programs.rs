//! End-to-end tests on real interpreters (python3, perl, bash, node, java) running the scripts of
//! tests/progs/, through the canonical scenario (see `tests::canonical_scenario`).

use std::path::Path;
use std::time::Duration;

use tests::*;

/// Seconds each script runs (uninterrupted); see tests/core.rs. Longer than the C programs':
/// bash's loop ended before the crash once on a loaded machine, its first checkpoint slow.
const SECONDS: &str = "8";

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn python3() {
    canonical_scenario(&Case::new("python3", |_| vec![os(interpreter("python3")), os(prog("compute.py")), os(SECONDS)]));
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn perl() {
    canonical_scenario(&Case::new("perl", |_| vec![os(interpreter("perl")), os(prog("compute.pl")), os(SECONDS)]));
}

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn bash() {
    canonical_scenario(&Case::new("bash", |_| vec![os(interpreter("bash")), os(prog("loop.sh")), os(SECONDS)]));
}

/// Node.js running tests/progs/compute.js: V8's threads, libuv's event loop and thread pool
/// (PBKDF2 each step), a worker thread answering over a message port, timers.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn node() {
    canonical_scenario(&Case::new("node", |_| vec![os(interpreter("node")), os(prog("compute.js")), os(SECONDS)]));
}

/// A Java virtual machine (Debian's OpenJDK) running tests/progs/Compute.java: some twenty
/// threads of its own (JIT compilers, the collector's, the signal dispatcher) and a pool of
/// four workers handing answers to the main thread, a heap the collector moves, and its
/// performance counters in a shared-mapped file, /tmp/hsperfdata_USER/PID, which it writes all
/// the time: after a crash the file differs from the checkpoint's, so the job runs with
/// `--save-files`, which keeps it. The test's uninterrupted reference run is another JVM of
/// the same user with its own file in that directory, changed after the checkpoint: not the
/// job's (before, the restart refused it).
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn java() {
    build_progs();
    let classes = progs_dir().join("bin").join("java");
    assert!(
        classes.join("Compute.class").is_file(),
        "{} has no Compute.class: install a JDK (scripts/test.sh does) and run make -C tests/progs",
        classes.display()
    );
    let mut case = Case::new("java", move |_| vec![os(interpreter("java")), os("-cp"), os(&classes), os("Compute"), os(SECONDS)]);
    case.launch_options = vec!["--save-files".into()];
    canonical_scenario(&case);
}

/// A container inside the job, made with the real tools: util-linux `unshare --user
/// --map-root-user --mount` runs bash (tests/progs/container.sh) as root of a user namespace of
/// its own, where it mounts a tmpfs, binds a directory of the host read-only inside it and keeps
/// its step counter on the tmpfs. For root and for an ordinary user (who can mount only so).
/// Before the restarts the machine mounts a tmpfs below the bound directory: the restart's
/// namespace, in the job's user namespace, can copy the directory only with it (the kernel
/// locks it there); before, the restart failed ("copy it: Invalid argument").
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn bash_in_unshare_with_its_own_tmpfs_and_bind() {
    let case = Case::new("container", |work: &std::path::Path| {
        vec![
            os("unshare"),
            os("--user"),
            os("--map-root-user"),
            os("--mount"),
            os(interpreter("bash")),
            os(prog("container.sh")),
            os(work.join("c")),
            os(SECONDS),
        ]
    })
    .machine_mounts_below("c/data/machine");
    canonical_scenario(&case);
}

/// Threads in a user namespace the job made: util-linux `unshare --user --map-root-user` runs
/// tests/progs/threads (eight threads on a queue, blocked in futexes, sleeping and running) as
/// root of its own namespace, as a rootless container runs a program. Its threads cannot be
/// given their ids by clone3 from inside that namespace; a helper in the job's sets the job's
/// last pid before each is made. Before, such a process was refused at checkpoint.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn threads_in_a_user_namespace_of_their_own() {
    canonical_scenario(&Case::new("userns-threads", |_| vec![os("unshare"), os("--user"), os("--map-root-user"), os(prog("threads")), os(SECONDS)]));
}

/// The same two levels down: `unshare --user --map-root-user` twice (the first namespace holds
/// no process, only the second, as Charliecloud's ch-run leaves them), with the threads. The
/// restart makes the first on the way to the second, with its maps read from inside it at the
/// checkpoint. Before, a user namespace inside another one the job made was refused.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn threads_in_nested_user_namespaces() {
    canonical_scenario(&Case::new("userns-nested-threads", |_| {
        vec![os("unshare"), os("--user"), os("--map-root-user"), os("unshare"), os("--user"), os("--map-root-user"), os(prog("threads")), os(SECONDS)]
    }));
}

/// The same with a real interpreter: python3 in `unshare --user --map-root-user` with a pool of
/// threads (tests/progs/threads.py).
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn python3_threads_in_a_user_namespace_of_their_own() {
    canonical_scenario(&Case::new("userns-pythreads", |_| {
        vec![os("unshare"), os("--user"), os("--map-root-user"), os(interpreter("python3")), os(prog("threads.py")), os(SECONDS)]
    }));
}

/// bash whose executable is deleted while it runs (as a rebuild or an upgrade replaces a
/// program): a copy of bash in the work directory removes its own file, then runs
/// tests/progs/loop.sh in itself (`.`), through a crash round and a `--kill` round. Before, the
/// checkpoint was refused.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn bash_whose_executable_was_deleted() {
    canonical_scenario(&Case::new("deleted-bash", |work: &Path| {
        let copy = work.join("bash");
        let inner = format!(
            "cp {bash} {copy} && exec {copy} -c 'rm {copy} && set -- {SECONDS} && . {script}'",
            bash = interpreter("bash").display(),
            copy = copy.display(),
            script = prog("loop.sh").display()
        );
        vec![os("/bin/sh"), os("-c"), os(inner)]
    }));
}

/// A program in a Charliecloud container, as HPC users run one without privileges: Debian's
/// `ch-run` (charliecloud-runtime) on an image directory holding a static program
/// (tests/progs/compute), through a crash round and a `--kill` round. ch-run is root of a user
/// namespace to bind /dev, /proc, /sys, /tmp, the image itself and temporary files it deletes
/// at once at /etc/passwd and /etc/group, pivots into the image, and enters a second user
/// namespace as the user again; all of it comes back. Before, the checkpoint was refused. The
/// machine mounts a tmpfs below /tmp before the restarts (see the test above).
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_program_in_a_charliecloud_container() {
    let case = Case::new("charliecloud", |work: &Path| {
        let image = work.join("image");
        for dir in ["dev", "proc", "sys", "tmp", "home", "etc", "bin", "mnt", "run"] {
            std::fs::create_dir_all(image.join(dir)).unwrap();
        }
        for file in ["passwd", "group", "hosts", "resolv.conf"] {
            std::fs::write(image.join("etc").join(file), b"").unwrap();
        }
        copy_program(&prog("compute-static"), &image.join("bin/compute"));
        give_to_user(work);
        vec![os("/usr/bin/env"), os("USER=ckpt"), os("ch-run"), os(&image), os("--"), os("/bin/compute"), os(SECONDS)]
    })
    // Charliecloud binds the machine's /tmp, where the test's work directory is.
    .machine_mounts_below("machine")
    .check_image(|dir| {
        let i = inspect(dir);
        for what in ["the root pivoted into", "deleted since", "a user namespace no process is in"] {
            assert!(i.stdout.contains(what), "charliecloud: the last generation holds no {what:?}\n{i}");
        }
    });
    canonical_scenario(&case);
}

/// A host name of its own, as a container runtime gives one: util-linux `unshare --user
/// --map-root-user --uts` runs bash, which names its machine with `hostname` and `domainname`,
/// runs tests/progs/loop.sh as its child, and reads its names again (from /proc/sys/kernel)
/// once the loop is done, after the restarts: FAIL if they are not its own.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn bash_with_a_host_name_of_its_own() {
    canonical_scenario(&Case::new("uts-bash", |_| {
        let inner = format!(
            "hostname ckpt-box && domainname ckpt.example && {} {} {SECONDS} && h=$(</proc/sys/kernel/hostname) && d=$(</proc/sys/kernel/domainname) && if [ \"$h $d\" != 'ckpt-box ckpt.example' ]; then echo \"FAIL names $h $d\"; fi",
            interpreter("bash").display(),
            prog("loop.sh").display()
        );
        vec![os("unshare"), os("--user"), os("--map-root-user"), os("--uts"), os(interpreter("bash")), os("-c"), os(inner)]
    }));
}

/// System V objects of its own, as a container runtime's `--ipc` gives: util-linux `unshare
/// --user --map-root-user --ipc` runs bash, which makes a segment, a message queue and a
/// semaphore set with `ipcmk` (random keys), lists them with `ipcs`, runs tests/progs/loop.sh
/// as its child, and lists them again after the restarts: FAIL unless the listing (keys, ids,
/// owners, modes, sizes) is the same.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn bash_with_ipc_objects_of_its_own() {
    canonical_scenario(&Case::new("ipc-bash", |_| {
        let inner = format!(
            "ipcmk -M 8192 -Q -S 3 >/dev/null && before=$(ipcs) && {} {} {SECONDS} && after=$(ipcs) && if [ \"$before\" != \"$after\" ]; then echo \"FAIL objects before: $before after: $after\"; fi",
            interpreter("bash").display(),
            prog("loop.sh").display()
        );
        vec![os("unshare"), os("--user"), os("--map-root-user"), os("--ipc"), os(interpreter("bash")), os("-c"), os(inner)]
    }));
}

/// A web server in a network of its own, as `podman --network none` or `bwrap --unshare-net`
/// gives: util-linux `unshare --user --map-root-user --net` runs bash, which brings lo up with
/// iproute2's `ip`, starts python3's http.server on 127.0.0.1 (the same port in the reference
/// run, in a namespace of its own too) and fetches a file from it with curl over and over,
/// through the checkpoints and restarts: FAIL unless every fetch gives the file whole.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_web_server_in_a_network_of_its_own() {
    canonical_scenario(&Case::new("netns-http", |work: &Path| {
        let file = work.join("page");
        std::fs::write(&file, (0..20_000u32).map(|i| format!("{i}\n")).collect::<String>()).unwrap();
        give_to_user(&file);
        let inner = format!(
            "ip link set lo up || exit 1; {python} -m http.server --bind 127.0.0.1 --directory {dir} 48071 >/dev/null 2>&1 & \
             echo START; ok=0; for i in $(seq 1 200); do if curl -s --retry 5 --retry-connrefused http://127.0.0.1:48071/page | cmp -s - {file}; then ok=$((ok+1)); else echo \"FAIL fetch $i\"; fi; sleep 0.04; done; \
             kill %1; echo \"RESULT $ok\"; [ $ok = 200 ] && echo PASS",
            python = interpreter("python3").display(),
            dir = work.display(),
            file = file.display(),
        );
        vec![os("unshare"), os("--user"), os("--map-root-user"), os("--net"), os(interpreter("bash")), os("-c"), os(inner)]
    }));
}

/// A sandbox as flatpak and build tools make it: bubblewrap (`bwrap`, unprivileged: in a user
/// namespace of its own) with a network, IPC and UTS namespace of its own and a host name, the
/// machine's root read-only, a tmpfs on /tmp, its own /dev and /proc, the work directory bound
/// writable, runs bash, which keeps a file on its /tmp, serves the work directory with
/// python3's http.server on 127.0.0.1 and fetches a page from it with curl through the
/// checkpoints and restarts: FAIL unless every fetch gives the page whole, the host name and
/// the file on /tmp stay. As an ordinary user bwrap runs the sandbox in a second user
/// namespace below the one that owns its mount, UTS, IPC and network namespaces: the restart
/// makes those on the way down (before, refused). Each fetch goes through a pipe to cmp, not
/// into a file: a file the job had open at a checkpoint and rewrote after it is refused by
/// the crash round's restart, as it should be (CI saw that race when the fetch went to a file).
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn bash_in_a_bubblewrap_sandbox() {
    canonical_scenario(&Case::new("bwrap", |work: &Path| {
        let page = work.join("page");
        std::fs::write(&page, (0..20_000u32).map(|i| format!("{i}\n")).collect::<String>()).unwrap();
        give_to_user(&page);
        let inner = format!(
            "echo kept > /tmp/mine; {python} -m http.server --bind 127.0.0.1 --directory {dir} 48072 >/dev/null 2>&1 & \
             echo START; ok=0; for i in $(seq 1 200); do if curl -s --retry 5 --retry-connrefused http://127.0.0.1:48072/page | cmp -s - {page}; then ok=$((ok+1)); else echo \"FAIL fetch $i\"; fi; sleep 0.04; done; \
             [ \"$(hostname)\" = box ] || echo \"FAIL host name $(hostname)\"; [ \"$(cat /tmp/mine)\" = kept ] || echo \"FAIL /tmp/mine\"; \
             kill %1; echo \"RESULT $ok\"; [ $ok = 200 ] && echo PASS",
            python = interpreter("python3").display(),
            dir = work.display(),
            page = page.display(),
        );
        let work = work.display().to_string();
        vec![
            os("bwrap"),
            os("--unshare-user"),
            os("--unshare-net"),
            os("--unshare-ipc"),
            os("--unshare-uts"),
            os("--hostname"),
            os("box"),
            os("--ro-bind"),
            os("/"),
            os("/"),
            os("--dev"),
            os("/dev"),
            os("--proc"),
            os("/proc"),
            os("--tmpfs"),
            os("/tmp"),
            os("--bind"),
            os(&work),
            os(&work),
            os(interpreter("bash")),
            os("-c"),
            os(inner),
        ]
    }));
}

/// A UTS and an IPC namespace made before the user namespace of a process in them (`unshare
/// --uts --ipc` runs sh, which names the machine, makes a segment with `ipcmk`, then runs bash
/// with `unshare --user`): both belong to the job's user namespace, where the restart makes
/// them again (sh) and joins them (bash) before bash goes down into its own. (Found by review:
/// bash joined after its way down, which the kernel refuses.) After the restarts the host name and the segment are
/// there, and renaming the machine is refused as it was (the process has no capability over
/// the namespace's owner). Root only: a UTS namespace outside a user namespace of the job's
/// needs CAP_SYS_ADMIN. (Before, refused at checkpoint time.)
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn namespaces_made_before_the_user_namespace_of_their_process() {
    needs_root("a UTS namespace outside a user namespace of the job's needs CAP_SYS_ADMIN");
    canonical_scenario(&Case::new("owned-above", |_| {
        let inner = format!(
            "before=$(ipcs -m | grep -c 0x); {bash} {script} {SECONDS}; \
             [ \"$(hostname)\" = inner ] || echo \"FAIL host name $(hostname)\"; \
             hostname other 2>/dev/null && echo 'FAIL the host name could be changed'; \
             [ \"$(ipcs -m | grep -c 0x)\" = \"$before\" ] && [ \"$before\" = 1 ] || echo \"FAIL segments $before then $(ipcs -m | grep -c 0x)\"",
            bash = interpreter("bash").display(),
            script = prog("loop.sh").display()
        );
        // Not exec'd: sh stays, the namespaces' maker, in the job's user namespace, and bash,
        // below, joins them before its way down at restart.
        let outer = format!(
            "hostname inner && ipcmk -M 4096 >/dev/null && unshare --user --map-root-user {} -c '{}'; :",
            interpreter("bash").display(),
            inner.replace('\'', "'\\''")
        );
        vec![os("unshare"), os("--uts"), os("--ipc"), os("/bin/sh"), os("-c"), os(outer)]
    }));
}

/// util-linux `script` runs bash in a pseudo-terminal and copies its output: a master and a
/// slave in two processes, with the output crossing the terminal, and `script` waiting in
/// poll(2) with a timeout (which must be repeated after a restart, not fail with EINTR: script
/// takes EINTR as the end and kills its child).
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn script_runs_bash_in_a_pseudo_terminal() {
    canonical_scenario(&Case::new("script", |_| {
        let inner = format!("{} {} {SECONDS}", interpreter("bash").display(), prog("loop.sh").display());
        vec![os("/usr/bin/script"), os("-qfec"), os(inner), os("/dev/null")]
    }));
}

/// tmux (tests/progs/tmux.sh): a server in a session of its own holding its pane's pseudo-terminal
/// master, the pane's shell printing a line every 0.1 s, a client attached through `script`'s
/// pseudo-terminal, short-lived clients asking the server twice a second. Three restarts, each
/// from a checkpoint of the job the one before brought back (two crashes, then `--kill`): the
/// second used to come back without its server. The job then checks the pane's history (every
/// line once, in order), that the client is still attached and that its terminal showed the
/// pane's last line.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn tmux_survives_restart_after_restart() {
    let sb = Sandbox::new("tmux");
    let work = sb.mkdir("work");
    let argv = vec![os(interpreter("bash")), os(prog("tmux.sh")), os(&work)];
    let mut job = Job::launch(&sb.dir, &argv, &sb.path("launch.out"));
    job.wait_for_line("START", Duration::from_secs(30));
    for round in 1..=3 {
        std::thread::sleep(Duration::from_secs(1));
        if round < 3 {
            job.checkpoint(&[]);
            std::thread::sleep(Duration::from_millis(500));
            job.kill_launcher();
        } else {
            job.checkpoint(&["--kill"]);
            job.wait_killed();
        }
        job = Job::restart(&sb.dir, &sb.path(&format!("restart{round}.out")));
        // Running again: a poll of the server printed after the restart.
        job.wait_for_line_starting("poll ", Duration::from_secs(30));
        assert_not_rerun(&job);
    }
    std::thread::sleep(Duration::from_secs(1));
    std::fs::write(work.join("finish"), b"").unwrap();
    let status = job.wait();
    let out = job.output();
    // Each round's polls say where the pane's history began then: where a line went.
    let rounds: String = ["launch.out", "restart1.out", "restart2.out"]
        .iter()
        .map(|f| format!("--- {f}:\n{}\n", std::fs::read_to_string(sb.path(f)).unwrap_or_default()))
        .collect();
    assert!(
        status.success() && has_line(&out, "PASS") && has_line(&out, "DONE") && fail_lines(&out).is_empty(),
        "tmux after three restarts:\n{}\n{rounds}",
        job.report()
    );
}

/// nginx, a master and two workers sharing the listening socket (each worker holds it, with
/// its own epoll instance and the channel socketpair to the master), serving a 24 MB file to
/// curl inside the job at 4 MB/s: the download is in flight (in the socket buffers, nginx in
/// the middle of a sendfile) at every checkpoint of the scenario. The file must arrive whole
/// and right, and nginx must serve it again after the last restart.
const NGINX_JOB: &str = r#"
W=$1; PORT=$2
mkdir -p "$W/html" "$W/tmp"
yes 'nginx under ckpt: every byte of this file must arrive once and in order' | head -c 24000000 > "$W/html/big"
{
  [ "$(id -u)" = 0 ] && echo "user root;"
  echo "worker_processes 2; pid $W/nginx.pid; error_log $W/error.log;"
  echo "events { worker_connections 64; }"
  echo "http { access_log $W/access.log; sendfile on;"
  for t in client_body proxy fastcgi uwsgi scgi; do echo "${t}_temp_path $W/tmp/$t;"; done
  echo "server { listen 127.0.0.1:$PORT; root $W/html; } }"
} > "$W/nginx.conf"
nginx -c "$W/nginx.conf" -g 'daemon off;' 2>"$W/nginx.err" &
ng=$!
# Ready when it answers (curl fails on a refused connection; any HTTP answer will do).
for i in $(seq 200); do curl -s -o /dev/null "http://127.0.0.1:$PORT/" && break; sleep 0.05; done
echo START
want=$(sha256sum < "$W/html/big" | cut -c1-16)
got=$(curl -s --limit-rate 4M "http://127.0.0.1:$PORT/big" | sha256sum | cut -c1-16)
again=$(curl -s "http://127.0.0.1:$PORT/big" | sha256sum | cut -c1-16)
echo "RESULT $got"
if [ "$got" = "$want" ] && [ "$again" = "$want" ]; then echo PASS; else echo "FAIL download $got, again $again, want $want: $(cat "$W/nginx.err" "$W/error.log" 2>/dev/null | tail -3)"; fi
# Its port free again for the rest of the suite (the reference run's nginx is no job's).
kill "$ng"; wait "$ng" || true
"#;

#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn nginx_serves_a_download_through_every_checkpoint() {
    assert!(std::path::Path::new("/usr/sbin/nginx").is_file(), "nginx is not installed: apt-get install nginx-light (scripts/test.sh does)");
    canonical_scenario(&Case::new("nginx", |work: &std::path::Path| {
        // A port of its own for each run (the reference run goes on at the same time).
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        vec![os("/bin/sh"), os("-c"), os(NGINX_JOB), os("nginx"), os(work), os(port.to_string())]
    }));
}

/// An OpenSSH server under ckpt (root, `--tcp-established`): the listener, a logged-in session
/// (`ssh` running a loop that echoes each line it reads) and a connection waiting at the
/// password prompt, whose privilege-separated child runs in sshd's seccomp sandbox. A crash
/// round (checkpoint, the job runs on, crash, restart: new logins work), then a `--kill` round
/// with the session and the waiting connection open: after the restart the session goes on
/// where it was, the sandboxed child (kept in its sandbox, `ckpt inspect` shows it) reads the
/// password and says no, and new logins still work.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn an_openssh_server_with_a_session_and_a_sandboxed_child() {
    use std::io::{BufRead, Write};
    use std::os::unix::fs::OpenOptionsExt;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    needs_root("sshd runs as root, and TCP repair mode keeps the clients' connections");
    let sshd = Path::new("/usr/sbin/sshd");
    assert!(sshd.exists(), "/usr/sbin/sshd is not installed (scripts/test.sh installs openssh-server)");
    let sb = Sandbox::new("sshd");
    let w = sb.mkdir("ssh");
    let keygen = |name: &str| {
        let key = w.join(name);
        let made = Command::new("ssh-keygen").args(["-q", "-t", "ed25519", "-N", "", "-f"]).arg(&key).status().unwrap();
        assert!(made.success(), "ssh-keygen {name}");
        key
    };
    let (host_key, client_key) = (keygen("host"), keygen("client"));
    std::fs::copy(w.join("client.pub"), w.join("root.keys")).unwrap();
    std::fs::create_dir_all("/run/sshd").unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config = w.join("sshd_config");
    std::fs::write(
        &config,
        format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {}\nPidFile none\nUsePAM no\nStrictModes no\nAuthorizedKeysFile {}/%u.keys\n\
             PermitRootLogin yes\nPasswordAuthentication yes\nKbdInteractiveAuthentication no\nLogLevel VERBOSE\n",
            host_key.display(),
            w.display()
        ),
    )
    .unwrap();
    let ssh = |extra: &[&str]| {
        let mut c = Command::new("ssh");
        c.arg("-p").arg(port.to_string()).args([
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
            "-o",
            "ConnectTimeout=10",
        ]);
        c.args(extra);
        c
    };
    let key = client_key.to_str().unwrap().to_string();
    let login_works = |when: &str| {
        let start = Instant::now();
        loop {
            let out = ssh(&["-i", &key, "-o", "BatchMode=yes", "root@127.0.0.1", "echo", "hello"]).stdin(Stdio::null()).output().unwrap();
            if String::from_utf8_lossy(&out.stdout).trim() == "hello" {
                return;
            }
            assert!(start.elapsed() < Duration::from_secs(20), "no login {when}: {}", String::from_utf8_lossy(&out.stderr));
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let argv = [os(sshd), os("-D"), os("-e"), os("-f"), os(&config)];
    let mut launch = Job::launch_with(&sb.dir, &["--tcp-established"], &argv, &sb.path("launch.out"));
    login_works("at the start");

    // The crash round: the server comes back, listening.
    launch.checkpoint(&[]);
    login_works("after a checkpoint");
    launch.kill_launcher();
    let mut first = Job::restart(&sb.dir, &sb.path("restart1.out"));
    login_works("after a crash and a restart");

    // A session, and a connection at the password prompt (the client's askpass waits on a FIFO).
    let mut session = ssh(&["-i", &key, "-o", "BatchMode=yes", "root@127.0.0.1", "while read l; do echo \"got $l\"; done"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut to_session = session.stdin.take().unwrap();
    let (tx, from_session) = std::sync::mpsc::channel();
    let out = session.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut says = |line: &str, when: &str| {
        writeln!(to_session, "{line}").unwrap();
        let got = from_session.recv_timeout(Duration::from_secs(20));
        assert_eq!(got.as_deref(), Ok(format!("got {line}").as_str()), "the session did not answer {when}");
    };
    says("one", "at first");
    let fifo = w.join("password");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success(), "mkfifo");
    let askpass = w.join("askpass");
    std::fs::write(&askpass, format!("#!/bin/sh\nexec head -1 {}\n", fifo.display())).unwrap();
    std::fs::set_permissions(&askpass, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let waiting =
        ssh(&["-o", "PreferredAuthentications=password", "-o", "PubkeyAuthentication=no", "-o", "NumberOfPasswordPrompts=1", "root@127.0.0.1", "true"])
            .env("SSH_ASKPASS", &askpass)
            .env("SSH_ASKPASS_REQUIRE", "force")
            .env("DISPLAY", "none")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
    // Until the server's sandboxed child for it is there (sshd clears its children's
    // environment, and with it the harness's tag: found by name).
    let sandboxed = || {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .any(|e| std::fs::read_to_string(e.path().join("status")).is_ok_and(|s| s.starts_with("Name:\tsshd\n") && s.contains("Seccomp:\t2")))
    };
    // And until the client is at the prompt, its askpass reading the FIFO: the connection is
    // idle then (a packet sent between the --kill and the restart would be answered by a reset).
    let at_prompt = || {
        let fifo = fifo.to_string_lossy().into_owned();
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .any(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains(&fifo)))
    };
    let start = Instant::now();
    while !(sandboxed() && at_prompt()) {
        assert!(start.elapsed() < Duration::from_secs(20), "no sandboxed child of sshd came for the connection at the password prompt, or no prompt");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(200));

    // The --kill round, with both open.
    first.checkpoint(&["--kill"]);
    first.wait_killed();
    let i = inspect(&sb.dir);
    assert!(
        i.stdout.contains("seccomp: thread") && i.stdout.contains("to a peer outside the job"),
        "the image holds no sandboxed child, or no client connection\n{i}"
    );
    let mut second = Job::restart(&sb.dir, &sb.path("restart2.out"));
    // Nothing is sent on the kept connections before the restart is done: between the --kill
    // and the restart of their sockets, the machine answers a packet with a reset (CRIU drops
    // them with a firewall rule meanwhile; ckpt does not yet).
    login_works("after the --kill round's restart");
    says("two", "after the --kill round's restart");
    // The waiting client gets its password now: the sandboxed child reads it and says no.
    let mut password = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .unwrap_or_else(|e| panic!("the client at the password prompt is gone: {e}"));
    writeln!(password, "wrong").unwrap();
    let refused = waiting.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && said.contains("Permission denied"), "the connection at the password prompt did not get its answer: {said}");
    login_works("at the end");
    drop(to_session);
    assert!(session.wait().unwrap().success(), "the session did not end well");
    second.kill_launcher();
}
