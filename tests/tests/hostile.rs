//! Shared clusters (issue 34): another local user acts against a job's directories, as an
//! attacker with nothing but an ordinary account would. Each test fails on a ckpt that trusts
//! directories and secrets as found, or that acts with root's rights through a user's path.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use tests::*;

/// Someone other than the jobs' user: root when the jobs run as an ordinary user, else nobody.
fn another_user() -> (u32, u32) {
    if jobs_as_root() {
        (65534, 65534)
    } else {
        (0, 0)
    }
}

const PLANTED_SECRET: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// Another user made a directory everyone may write, with a secret everyone may read, where the
/// victim's job was to keep its images: the victim's launch is refused, naming the directory,
/// and writes nothing there (before, it used the planted secret, and the planter could read the
/// job's images and move its generations away). A directory of the victim's own with a secret
/// others may read is refused too.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_planted_directory_or_a_readable_secret_is_refused() {
    needs_harness_root();
    let sb = Sandbox::new("planted");
    let planted = sb.path("planted");
    std::fs::create_dir(&planted).unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::write(planted.join("secret"), PLANTED_SECRET).unwrap();
    std::fs::set_permissions(planted.join("secret"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let (uid, gid) = another_user();
    std::os::unix::fs::chown(&planted, Some(uid), Some(gid)).unwrap();
    std::os::unix::fs::chown(planted.join("secret"), Some(uid), Some(gid)).unwrap();

    let out = ckpt(&[os("launch"), os("--dir"), os(&planted), os("--"), os("/bin/true")]);
    assert!(!out.success(), "a launch used a directory another user planted\n{out}");
    assert!(out.stderr.contains(&*planted.to_string_lossy()) && out.stderr.contains("no other user may change"), "the refusal does not say why\n{out}");
    let entries: Vec<String> = std::fs::read_dir(&planted).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(entries, vec!["secret".to_string()], "the refused launch wrote in the planted directory");
    assert_eq!(std::fs::read_to_string(planted.join("secret")).unwrap(), PLANTED_SECRET);

    // The user's own directory, with a secret others may read (copied there by hand, say).
    let own = sb.mkdir("own");
    std::fs::write(own.join("secret"), PLANTED_SECRET).unwrap();
    give_to_user(&own.join("secret"));
    std::fs::set_permissions(own.join("secret"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = ckpt(&[os("launch"), os("--dir"), os(&own), os("--"), os("/bin/true")]);
    assert!(!out.success() && out.stderr.contains("may read it"), "a launch used a secret others may read\n{out}");
}

/// Root's `inspect` and `verify` of a user's image read it with the user's rights: a MANIFEST
/// the user linked to a file only root may read shows none of its bytes (before, the refusal
/// quoted its first ones).
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn root_reads_a_users_image_with_the_users_rights() {
    needs_root("root reading a user's image");
    let sb = Sandbox::new("manifest-link");
    let secret_file = sb.path("roots-only");
    std::fs::write(&secret_file, "XQZ31337 root-only bytes\n").unwrap();
    std::fs::set_permissions(&secret_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (uid, gid) = (65534, 65534);
    let users = sb.path("users");
    let gen = users.join("img/gen-000001");
    std::fs::create_dir_all(&gen).unwrap();
    std::os::unix::fs::symlink(&secret_file, gen.join("MANIFEST")).unwrap();
    std::fs::write(gen.join("COMMITTED"), b"").unwrap();
    for p in [users.clone(), users.join("img"), gen.clone(), gen.join("COMMITTED")] {
        std::os::unix::fs::lchown(&p, Some(uid), Some(gid)).unwrap();
    }
    std::os::unix::fs::lchown(gen.join("MANIFEST"), Some(uid), Some(gid)).unwrap();
    std::fs::set_permissions(sb.path(""), std::fs::Permissions::from_mode(0o755)).unwrap();
    for verb in ["inspect", "verify"] {
        let out = ckpt(&[os(verb), os(users.join("img"))]);
        assert!(!out.success(), "{verb} of a forged image succeeded\n{out}");
        assert!(!out.all().contains("XQZ31"), "root's {verb} printed bytes of a file only root may read, through the user's link\n{out}");
    }
}

/// A user swaps their image directory with a link to root's own image, again and again, while
/// root inspects the user's directory: root must never show root's image (it opens the directory
/// once without following a link, becomes its owner, and checks that the path still leads
/// there). Before, root decided by one look at the path and read by another.
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_directory_swapped_while_root_acts_on_it_never_gives_roots_image() {
    needs_root("root acting on a user's directory");
    let sb = Sandbox::new("swap");
    // Root's own image, of a job whose working directory names it.
    let marker = sb.path("roots-job-cwd-31337");
    std::fs::create_dir(&marker).unwrap();
    let roots = sb.path("roots-img");
    let mut cmd = std::process::Command::new(ckpt_bin());
    cmd.args([os("launch"), os("--dir"), os(&roots), os("--"), os("sleep"), os("30")]).current_dir(&marker);
    cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
    let mut launch = cmd.spawn().unwrap();
    let mut committed = false;
    for _ in 0..100 {
        if try_checkpoint(&roots, &["--kill"]).is_ok() {
            committed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(committed, "root's image could not be made");
    let _ = launch.wait();
    assert!(inspect(&roots).stdout.contains("roots-job-cwd-31337"), "root's own inspect does not show the marker");

    // The user's directory: an image of their own (empty, so inspect fails on it), and a link to
    // root's image beside it; the two are swapped atomically (RENAME_EXCHANGE) all the time.
    let (uid, gid) = (65534u32, 65534u32);
    let home = sb.path("user");
    std::fs::create_dir(&home).unwrap();
    std::fs::set_permissions(sb.path(""), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (dir, link) = (home.join("img"), home.join("img.link"));
    std::fs::create_dir(&dir).unwrap();
    std::os::unix::fs::symlink(&roots, &link).unwrap();
    for p in [&home, &dir, &link] {
        std::os::unix::fs::lchown(p, Some(uid), Some(gid)).unwrap();
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = {
        let (stop, dir, link) = (stop.clone(), dir.clone(), link.clone());
        std::thread::spawn(move || {
            let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
            let (a, b) = (c(&dir), c(&link));
            let mut swaps = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // SAFETY: two valid C strings; renameat2 takes no other memory.
                let r = unsafe { libc::renameat2(libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), libc::RENAME_EXCHANGE) };
                assert_eq!(r, 0, "renameat2: {}", std::io::Error::last_os_error());
                swaps += 1;
            }
            swaps
        })
    };
    let rounds = 150;
    let mut refused_as_changed = 0;
    for round in 0..rounds {
        let out = ckpt(&[os("inspect"), os(&dir)]);
        assert!(!out.all().contains("roots-job-cwd-31337"), "round {round}: root's inspect of the user's directory showed root's image\n{out}");
        if out.stderr.contains("changed while ckpt opened it") {
            refused_as_changed += 1;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    eprintln!("{rounds} inspections, {swaps} swaps, {refused_as_changed} refused as swapped meanwhile");
    assert!(std::fs::metadata(&roots).unwrap().uid() == 0);
}

/// A user plants `job.json` as a link to a file only root may write, in their own directory,
/// and root launches a job there: root acts as the directory's owner and never writes through a
/// link, so root's file is left as it was (before, root's launch overwrote it).
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_link_planted_for_job_json_never_makes_root_write_roots_file() {
    needs_root("root launching in a user's directory");
    let sb = Sandbox::new("job-json-link");
    std::fs::set_permissions(sb.path(""), std::fs::Permissions::from_mode(0o755)).unwrap();
    let victim = sb.path("roots-only");
    std::fs::write(&victim, b"root's data\n").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (uid, gid) = (65534u32, 65534u32);
    let users = sb.path("users-img");
    std::fs::create_dir(&users).unwrap();
    std::fs::set_permissions(&users, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(&victim, users.join("job.json")).unwrap();
    std::os::unix::fs::lchown(users.join("job.json"), Some(uid), Some(gid)).unwrap();
    std::os::unix::fs::chown(&users, Some(uid), Some(gid)).unwrap();
    let out = ckpt(&[os("launch"), os("--dir"), os(&users), os("--"), os("/bin/true")]);
    assert_eq!(std::fs::read(&victim).unwrap(), b"root's data\n", "root's launch wrote through the user's link\n{out}");
    assert_eq!(std::fs::metadata(&victim).unwrap().uid(), 0);
}

/// A root job protects a directory below one a user may write in (`--protect USERS/mid/data`).
/// After the checkpoint the user turns `mid` into a link to a place only root may write, holding
/// a tree of the same shape. Root's restart is refused, saying a link is in the way, and root's
/// files there are left as they were (before, the put-back walked through the link as root: it
/// removed root's files the record did not list and wrote the job's over root's).
#[test]
#[cfg_attr(ckpt_skip_e2e, ignore = "CKPT_SKIP_E2E was set when the tests were built")]
fn a_link_on_the_way_to_a_protected_directory_never_makes_root_write_there() {
    needs_root("a root job whose protected directory lies below a user's");
    let sb = Sandbox::new("protect-link");
    let users = sb.mkdir("users");
    let (uid, gid) = (65534, 65534);
    std::os::unix::fs::chown(&users, Some(uid), Some(gid)).unwrap();
    let data = users.join("mid").join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("state"), b"the job's state\n").unwrap();
    let protect = data.to_string_lossy().into_owned();
    let mut launch = Job::launch_with(&sb.dir, &["--protect", &protect], &[os(prog("compute")), os("30")], &sb.path("launch.out"));
    launch.wait_for_line("START", Duration::from_secs(30));
    check_checkpoint_json(&launch.checkpoint(&["--kill"]));
    launch.wait_killed();

    // Root's own tree, which no user may reach.
    let roots = sb.mkdir("roots");
    std::fs::set_permissions(&roots, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::create_dir(roots.join("data")).unwrap();
    std::fs::write(roots.join("data/state"), b"root's state\n").unwrap();
    std::fs::write(roots.join("data/secret"), b"root's secret\n").unwrap();
    // What the user may do in their directory: move `mid` away and put a link in its place.
    std::fs::rename(users.join("mid"), users.join("mid.old")).unwrap();
    std::os::unix::fs::symlink(&roots, users.join("mid")).unwrap();
    std::os::unix::fs::lchown(users.join("mid"), Some(uid), Some(gid)).unwrap();

    let mut restart = Job::restart(&sb.dir, &sb.path("restart.out"));
    let status = restart.wait_timeout(Duration::from_secs(60));
    assert!(!status.success() && result_line(&restart.output()).is_none(), "the restart went on through the user's link\n{}", restart.report());
    wait_job_gone(&sb.dir, Duration::from_secs(5), "a refused restart");
    let err = restart.errors();
    assert!(err.contains("symbolic link") && err.contains(&protect), "the refusal does not say a link is in the way of {protect}\n{err}");
    assert_eq!(std::fs::read(roots.join("data/state")).unwrap(), b"root's state\n", "root's file was written through the user's link");
    assert_eq!(std::fs::read(roots.join("data/secret")).unwrap(), b"root's secret\n", "root's file was removed through the user's link");
}
