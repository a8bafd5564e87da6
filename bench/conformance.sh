#!/bin/bash
# The conformance driver (issue 38, item 7): CRIU 4.2's zdtm static tests run through ckpt.
#
# Each test is a small program that sets some kernel state up, daemonizes (its pid written to
# a pid file once it is ready), waits for SIGTERM, then checks that its state is still as it
# made it and writes PASS or FAIL (with its reason) to its output file (zdtm's protocol:
# test/zdtm/lib/test.c). Here every test is run twice, one at a time, each in a fresh directory
# under $SCRATCH/run/NAME, as root:
#   - without ckpt: started, SIGTERM, its verdict read. A test that fails so is counted apart
#     (it fails on this machine anyway), not blamed on ckpt. It runs under `unshare --pid
#     --mount --mount-proc`, in the same kind of namespaces ckpt gives a job;
#   - under ckpt: `ckpt launch` of a wrapper (the job's main process, which stays) that starts
#     the test, waits for the file `term`, sends SIGTERM to the pid in the pid file (a job's
#     pids are the same after a restart) and waits for the test's end. The driver waits for the
#     pid file, runs `ckpt checkpoint --kill`, then `ckpt restart`, creates `term`, and reads
#     the verdict: PASS, FAIL (the test's words), checkpoint refused (ckpt's message), restart
#     failed (its message), or timeout ($TIMEOUT s after the restart started).
# With CRIU=1, each test is also run through CRIU 4.2 on the same driver: started, `criu dump`
# (which ends it), `criu restore -d`, SIGTERM, its verdict (CRIU given the test's own options
# from its .desc, as CRIU's runner gives them).
#
# Which tests: every static test CRIU's own runner (test/zdtm.py -a) would run in its host
# flavor as root, on this machine: left out are tests for another architecture, `noauto`
# tests, tests that run only in a new namespace (`flavor` without `h`), tests needing a kernel
# feature `criu check --feature` says is missing, and tests whose `.checkskip` fails. Tests
# flagged `crfail` (CRIU's dump is expected to refuse them) are run and reported apart. zdtm's
# hooks (NAME.hook) run as CRIU's runner runs them (--post-start as the test starts, --pre-dump,
# --pre-restore, --clean) but --post-restore, which reads CRIU's images; their failures are
# logged only. What zdtm.py checks besides the test's own verdict (descriptors, mappings and
# mounts compared before and after) is not checked here: the test judges itself.
#
# Prints a line per test as it goes and a summary, and writes the counts and the failures by
# group to docs/CONFORMANCE.md (a run of named tests writes $SCRATCH/CONFORMANCE.md instead).
# Per-test logs stay under $SCRATCH/run/NAME (launch.log, checkpoint.log, restart.log,
# base.log, criu-*.log, the test's output); images and the test's files are removed after each
# test, and every process, mount and file of a test is ended, unmounted and removed.
#
# Usage: bench/conformance.sh build          (bench/anchors.sh build, then zdtm's static tests)
#        bench/conformance.sh [TEST...]      (default: every applicable static test)
#        bench/conformance.sh report         (the last run's report written again; SECOND=DIR
#                                             adds a second run's results from scratch root DIR,
#                                             e.g. of the failures again with CRIU=1)
# Environment: ANCHORS (default /var/tmp/ckpt-anchors): where CRIU 4.2 is built;
#   CKPT (default target/x86_64-unknown-linux-gnu/release/ckpt): the binary, copied to $SCRATCH
#   first so that a rebuild during the run does not change it; CKPT_COMMIT: what to call it in
#   the report (default: this repository's `git describe --always --dirty`);
#   SCRATCH (default /var/tmp/ckpt-conformance); TIMEOUT (default 60): seconds a test has after
#   its restart; CRIU=1: CRIU's own count on the same driver too; DOC: the report's path;
#   YIELD_TO: a command line (pgrep -f) that goes first: no test starts while it runs.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
ANCHORS=${ANCHORS:-/var/tmp/ckpt-anchors}
ZDTM=$ANCHORS/criu/test/zdtm
STATIC=$ZDTM/static
CRIU_BIN=$ANCHORS/criu/criu/criu
SCRATCH=${SCRATCH:-/var/tmp/ckpt-conformance}
TIMEOUT=${TIMEOUT:-60}
CRIU=${CRIU:-0}

if [ "${1:-}" = build ]; then
    [ "$(id -u)" = 0 ] || { echo "conformance.sh build: run as root (apt-get)" >&2; exit 1; }
    bash bench/anchors.sh build
    # What some tests call at run time (their hooks, or the test itself).
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables iptables util-linux libnl-route-3-dev > /dev/null
    make -C "$ZDTM/lib" -j"$(nproc)" > "$ANCHORS/zdtm.build.log"
    # -k: a test that does not build here is reported as not built by the run, not the end of
    # the build (the rest are built).
    make -k -C "$STATIC" -j"$(nproc)" >> "$ANCHORS/zdtm.build.log" 2>&1 ||
        echo "some zdtm tests did not build (see $ANCHORS/zdtm.build.log)" >&2
    echo "zdtm static tests built in $STATIC"
    exit 0
fi

[ "$(id -u)" = 0 ] || { echo "conformance.sh: the tests run as root (zdtm's host flavor); run as root" >&2; exit 1; }
[ -x "$CRIU_BIN" ] && [ -f "$ZDTM/lib/libzdtmtst.a" ] && [ -x "$STATIC/pipe00" ] ||
    { echo "conformance.sh: run 'bench/conformance.sh build' first (looked in $ANCHORS)" >&2; exit 1; }
# The group of issue 38's list a test belongs to, by its name.
group_of() {
    case $1 in
        cgroup*) echo cgroups ;;
        membarrier | mlock_setuid) echo processes ;;
        seccomp*) echo seccomp ;;
        pty* | tty* | console | vt | jobctl*) echo terminals ;;
        mnt* | mount* | mntns* | bind* | overmount* | tmpfs* | devpts* | binfmt* | autofs* | sysfs* | \
            shared_slave* | private_bind* | rec_bind* | chroot* | pivot*) echo mounts ;;
        sock* | sk-* | scm* | packet_sock* | unbound_sock | del_standalone_un* | deleted_unix_sock | \
            net_lock* | netns* | netlink* | tun* | socket*) echo sockets ;;
        maps* | cow* | mprotect* | mlock* | thp* | vdso* | shmemfd* | memfd* | uffd* | mem* | \
            madvise* | shm* | huge* | ghost_holes* | aio*) echo memory ;;
        file* | fd* | fifo* | pipe* | unlink* | ghost* | link* | symlink* | rmdir* | inotify* | \
            fanotify* | eventfs* | epoll* | eventfd* | signalfd* | timerfd* | write_read* | mtime* | \
            deleted* | opath* | selfexe* | proc-self | child_opened_proc | unhashed_proc | pid_file | \
            poll | fd_from_pidfd | pidfd* | clone_fs | umask* | cwd*) echo files ;;
        pid* | pthread* | zombie* | wait* | ptrace* | sig* | stopped* | futex* | sched* | caps* | \
            groups | xids* | different_creds | thread_different_uid_gid | dumpable* | pdeath_sig | \
            pstree | child_subreaper* | env* | cmdlinenv* | rlimits* | oom_score_adj | loginuid | \
            fpu* | mmx* | sse* | rseq* | membarrier | timers* | posix_timers | time | timens* | \
            busyloop* | sleeping* | mlock_setuid) echo processes ;;
        *) echo other ;;
    esac
}

# The report from $SCRATCH/results.tsv, as the run's $SCRATCH/meta.sh describes it (REPORT_*),
# written again after each test (a run cut short leaves its report so far); report final: the
# summary on stdout too.
report() {
    REPORT_FINAL=$1 python3 - "$SCRATCH/tests.tsv" "$SCRATCH/results.tsv" "$REPORT_DOC" <<'PY'
import collections, datetime, os, sys
tests = [l.rstrip('\n').split('\t') for l in open(sys.argv[1])]
res = [l.rstrip('\n').split('\t') for l in open(sys.argv[2])]
doc = sys.argv[3]
criu = os.environ['REPORT_CRIU'] == '1'
GROUPS = ['memory', 'files', 'sockets', 'processes', 'mounts', 'terminals', 'cgroups', 'seccomp', 'other']
CLASS = {'PASS': 'passed', 'FAIL': 'restarted, but the test found its state wrong (FAIL)',
         'refused': 'checkpoint refused', 'restart-failed': 'restart failed', 'timeout': 'timeout',
         'no-start': 'did not start'}
ALONE = dict(CLASS, FAIL='FAIL')
import re
def words(m):
    # ckpt's message without what the class already says (which checkpoint or restart failed).
    m = re.sub(r'^ckpt: checkpoint of generation \d+ failed; the job goes on: (node \S+: )?'
               r'(capture on node \S+: )?(capture pid \d+: )?', '', m)
    m = re.sub(r'^ckpt: restart of generation \d+ from \S+ failed; nothing was left running: ', '', m)
    return m.replace('|', '/').strip().rstrip(';')
run = [r for r in res if r[2] == 'run']
crfail = [r for r in res if r[2] == 'crfail']
alone_ok = [r for r in run if r[3] == 'PASS']
alone_bad = [r for r in run if r[3] != 'PASS']
def counts(rows, col):
    c = collections.Counter(r[col] for r in rows)
    return ', '.join('%s %d' % (CLASS.get(k, k), c[k]) for k in CLASS if c[k])
out = []
w = out.append
w('# Conformance: CRIU 4.2\'s zdtm static tests through ckpt')
w('')
waited = 0
if os.path.exists(os.path.join(os.path.dirname(sys.argv[2]), 'waited')):
    waited = int(open(os.path.join(os.path.dirname(sys.argv[2]), 'waited')).read().split()[0])
took = int(os.path.getmtime(sys.argv[2])) - int(os.environ['REPORT_STARTED'])
w('Produced by `%s` (%s UTC, %s min%s, %s CPUs): kernel %s, ckpt %s, CRIU 4.2\'s tests '
  '(test/zdtm/static, built by `bench/conformance.sh build`), %s s per test after the restart.'
  % (os.environ['REPORT_CMD'], datetime.datetime.utcfromtimestamp(int(os.environ['REPORT_STARTED'])).strftime('%Y-%m-%d %H:%M'),
     -(-took // 60), ', %d of them waiting for another suite to end (YIELD_TO)' % (waited // 60) if waited >= 60 else '',
     os.environ['REPORT_CPUS'], os.environ['REPORT_KERNEL'], os.environ['REPORT_COMMIT'], os.environ['REPORT_TIMEOUT']))
w('')
w('Each test sets kernel state up, daemonizes, and after SIGTERM checks that state itself and '
  'writes PASS or FAIL. Each ran once alone (started, SIGTERM, in a PID and mount namespace as '
  'a job has) and once under ckpt (`ckpt launch` of a wrapper that starts it, `ckpt checkpoint '
  '--kill`, `ckpt restart`, then SIGTERM); see the header of bench/conformance.sh. zdtm\'s '
  'namespace flavors (the test in new namespaces of every kind, with a root of its own) are not '
  'reproduced: tests that run only there, most mount tests among them, are left out.' +
  (' Root here lacks CAP_SYS_RESOURCE (a container): what needs it fails, under ckpt as under '
   'CRIU (prlimit on a process of another user).'
   if os.environ['REPORT_CRIU_AS'] else '') +
  (' CRIU 4.2 ran on the same driver (`criu dump`, `criu restore -d`, the options of the '
   'test\'s .desc), without zdtm.py\'s checks besides the test\'s own%s.'
   % ('; as root throughout, as this machine\'s root lacks CAP_SYS_RESOURCE, without which CRIU '
      'cannot read the limits of a process of another user (zdtm\'s tests not flagged suid drop '
      'to uid 18943)' if os.environ['REPORT_CRIU_AS'] else '') if criu else ''))
w('')
w('## Counts')
w('')
skipped = [t for t in tests if t[1] == 'skip']
total, final = int(os.environ['REPORT_TOTAL']), os.environ['REPORT_FINAL'] == 'final'
if len(res) < total:
    w('**Partial: %d of the %d tests run so far%s.**' % (len(res), total, '' if not final else ' (the run was cut short)'))
    w('')
if total < len([t for t in tests if t[1] != 'skip']):
    w('A run of named tests only (%d).' % total)
    w('')
w('- static tests in CRIU 4.2: %d; left out as CRIU\'s runner leaves them out of a host-flavor '
  'run as root on this machine: %d (below); flagged `crfail` (CRIU refuses them by design), '
  'reported apart: %d' % (len(tests), len(skipped), len([t for t in tests if t[1] == 'crfail'])))
w('- applicable, run: **%d**' % len(run))
w('- failing alone, without ckpt (not counted against ckpt): %d' % len(alone_bad))
w('- passing alone: **%d**; under ckpt: **%d passed**; %s'
  % (len(alone_ok), sum(r[5] == 'PASS' for r in alone_ok), counts([r for r in alone_ok if r[5] != 'PASS'], 5) or 'no failure'))
if not criu:
    w('- CRIU 4.2: %s; issue 38 quotes 301 of 375 passed for CRIU 4.2 on such a driver'
      % ('run on this driver only on the tests ckpt failed, in a second run (below)'
         if os.environ.get('SECOND') else 'not run on this driver here (`CRIU=1` runs it beside ckpt)'))
if criu:
    w('- CRIU 4.2 on the same driver, of the same %d: **%d passed**; %s'
      % (len(alone_ok), sum(r[7] == 'PASS' for r in alone_ok), counts([r for r in alone_ok if r[7] != 'PASS'], 7) or 'no failure'))
    w('- both passed: %d; ckpt only: %d; CRIU only: %d'
      % (sum(r[5] == 'PASS' and r[7] == 'PASS' for r in alone_ok), sum(r[5] == 'PASS' and r[7] != 'PASS' for r in alone_ok),
         sum(r[5] != 'PASS' and r[7] == 'PASS' for r in alone_ok)))
w('')
w('| group | applicable, passing alone | ckpt passed |' + (' CRIU passed |' if criu else ''))
w('|---|---|---|' + ('---|' if criu else ''))
for g in GROUPS:
    rows = [r for r in alone_ok if r[1] == g]
    if rows:
        w('| %s | %d | %d |' % (g, len(rows), sum(r[5] == 'PASS' for r in rows)) +
          (' %d |' % sum(r[7] == 'PASS' for r in rows) if criu else ''))
w('')
second = os.environ.get('SECOND')
if second:
    two = {r[0]: r for r in (l.rstrip('\n').split('\t') for l in open(os.path.join(second, 'results.tsv')))}
    meta = open(os.path.join(second, 'meta.sh')).read()
    with_criu = 'REPORT_CRIU="1"' in meta
def line(r, col=5):
    s = '- `%s`: %s' % (r[0], ALONE.get(r[col], r[col]))
    if r[col + 1] != '-':
        s += ': ' + words(r[col + 1])
    if criu and col == 5:
        s += ' (CRIU: %s)' % ('passed' if r[7] == 'PASS' else CLASS.get(r[7], r[7]))
    elif second and with_criu and col == 5 and r[0] in two and two[r[0]][3] == 'PASS':
        s += ' (CRIU, second run: %s)' % ('passed' if two[r[0]][7] == 'PASS' else CLASS.get(two[r[0]][7], two[r[0]][7]))
    return s
bad = [r for r in alone_ok if r[5] != 'PASS']
wrong = [r for r in bad if r[5] == 'FAIL']
w('## Restarted, but wrong')
w('')
w('The worst kind: the checkpoint and the restart went through, and the test found its state '
  'different (its words are in the groups below): %s' % ('; '.join(
      '%s: %s' % (g, ', '.join('`%s`' % r[0] for r in wrong if r[1] == g))
      for g in GROUPS if any(r[1] == g for r in wrong)) or 'none') + '.')
w('')
w('## Failures under ckpt, by group')
w('')
w('Tests that pass alone and did not under ckpt; the reason is ckpt\'s message (a refused '
  'checkpoint or a failed restart) or the test\'s words. Logs of the run: the scratch root\'s '
  'run/NAME.')
w('')
for g in GROUPS:
    rows = [r for r in bad if r[1] == g]
    if not rows:
        continue
    w('### %s (%d)' % (g, len(rows)))
    w('')
    for r in rows:
        w(line(r))
    w('')
if criu:
    rows = [r for r in alone_ok if r[7] != 'PASS']
    w('## CRIU 4.2\'s failures on the same driver (%d)' % len(rows))
    w('')
    for r in rows:
        w(line(r, 7))
    w('')
w('## Failing alone, without ckpt (%d)' % len(alone_bad))
w('')
w('These fail on this machine without any checkpoint (kernel, container, missing tools); '
  'under ckpt they are not counted.')
w('')
for r in alone_bad:
    w('- `%s`: %s%s; under ckpt: %s' % (r[0], ALONE.get(r[3], r[3]), ': ' + words(r[4]) if r[4] != '-' else '',
                                        ALONE.get(r[5], r[5])))
w('')
if second:
    rows = [r for r in bad if r[0] in two]
    w('## A second run of the failures%s (%d)' % (' with CRIU 4.2 beside' if with_criu else '', len(rows)))
    w('')
    same = [r for r in rows if two[r[0]][5] == r[5]]
    w('The tests that failed under ckpt above, run again one by one on the same machine and binary%s '
      '(`%sbench/conformance.sh` with them named, then `SECOND=its scratch root bench/conformance.sh '
      'report`). ckpt: %d of %d failed the same way again%s.'
      % (', CRIU 4.2 on the same driver beside' if with_criu else '', 'CRIU=1 ' if with_criu else '', len(same), len(rows),
         ''.join('; `%s` %s this time (first: %s)' % (r[0], ALONE.get(two[r[0]][5], two[r[0]][5]),
                                                      ALONE.get(r[5], r[5]))
                 for r in rows if two[r[0]][5] != r[5])))
    if with_criu:
        ok = [r for r in rows if two[r[0]][3] == 'PASS']
        w('CRIU 4.2 passed **%d** of the %d of them that passed alone this time%s.'
          % (sum(two[r[0]][7] == 'PASS' for r in ok), len(ok),
             '' if len(ok) == len(rows) else ' (%s failed alone this time)' % ', '.join(
                 '`%s`' % r[0] for r in rows if two[r[0]][3] != 'PASS')))
        fails = [two[r[0]] for r in ok if two[r[0]][7] != 'PASS']
        if fails:
            w('CRIU\'s failures among them:')
            w('')
            for t in fails:
                w(line(t, 7))
    w('')
if crfail:
    w('## `crfail` tests (%d)' % len(crfail))
    w('')
    w('CRIU\'s runner expects its dump to refuse these; shown for what ckpt does with them.')
    w('')
    for r in crfail:
        w(line(r) + ('' if r[3] == 'PASS' else ' (fails alone too)'))
    w('')
w('## Left out (%d)' % len(skipped))
w('')
why = collections.defaultdict(list)
for t in skipped:
    why[t[2]].append(t[0])
for k in sorted(why, key=lambda k: -len(why[k])):
    w('- %s (%d): %s' % (k, len(why[k]), ', '.join(why[k])))
w('')
open(doc, 'w').write('\n'.join(out))
if not final:
    sys.exit(0)
# The summary on stdout.
print()
print('applicable %d; failing alone %d; passing alone %d: ckpt passed %d; %s'
      % (len(run), len(alone_bad), len(alone_ok), sum(r[5] == 'PASS' for r in alone_ok),
         counts([r for r in alone_ok if r[5] != 'PASS'], 5)))
if criu:
    print('CRIU 4.2 on the same driver: passed %d of %d' % (sum(r[7] == 'PASS' for r in alone_ok), len(alone_ok)))
print('report: %s' % doc)
PY
}

# `report`: the report of the last run written again from its results (after a run was cut
# short, or the groups changed).
if [ "${1:-}" = report ]; then
    [ -s "$SCRATCH/meta.sh" ] && [ -e "$SCRATCH/results.tsv" ] ||
        { echo "conformance.sh report: no run in $SCRATCH" >&2; exit 1; }
    # shellcheck disable=SC1091
    . "$SCRATCH/meta.sh"
    while IFS=$'\t' read -r n _ rest; do
        printf '%s\t%s\t%s\n' "$n" "$(group_of "$n")" "$rest"
    done < "$SCRATCH/results.tsv" > "$SCRATCH/results.tsv.new"
    touch -r "$SCRATCH/results.tsv" "$SCRATCH/results.tsv.new"
    mv "$SCRATCH/results.tsv.new" "$SCRATCH/results.tsv"
    report final
    exit 0
fi

CKPT_SRC=${CKPT:-$REPO/target/x86_64-unknown-linux-gnu/release/ckpt}
[ -x "$CKPT_SRC" ] || { echo "conformance.sh: no ckpt binary at $CKPT_SRC (build it, or set CKPT)" >&2; exit 1; }
CKPT_COMMIT=${CKPT_COMMIT:-$(git -C "$REPO" describe --always --dirty)}

# The driver runs under a reaper of its own (PR_SET_CHILD_SUBREAPER): every test daemonizes,
# and a daemon whose parent exits is adopted by the nearest reaper above it; without this one,
# the tests (and CRIU's restored ones) would be adopted by whatever runs the driver.
if [ -z "${CONF_REAPER:-}" ]; then
    exec env CONF_REAPER=$$ python3 -c '
import ctypes, os, signal, subprocess, sys
ctypes.CDLL(None).prctl(36, 1)                   # PR_SET_CHILD_SUBREAPER
main = subprocess.Popen(sys.argv[1:])
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, lambda n, f: main.send_signal(n))
code = None
while True:
    try:
        pid, status = os.wait()
    except ChildProcessError:
        break
    except InterruptedError:
        continue
    if pid == main.pid:
        code = os.waitstatus_to_exitcode(status)
        break
sys.exit(128 - code if code < 0 else code)
' bash "$REPO/bench/conformance.sh" "$@"
fi

mkdir -p "$SCRATCH"
chmod 755 "$SCRATCH"
CKPT=$SCRATCH/ckpt
cp "$CKPT_SRC" "$CKPT.new" && mv "$CKPT.new" "$CKPT"
RUN=$SCRATCH/run
rm -rf "$RUN"
mkdir -p "$RUN"
chmod 755 "$RUN"
started=$(date +%s)

# The tests to run: name, "run", "crfail" or "skip", why skipped, flags (zdtm.py's rules).
python3 - "$STATIC" "$CRIU_BIN" > "$SCRATCH/tests.tsv" <<'EOF'
import os, platform, subprocess, sys
static, criu = os.path.abspath(sys.argv[1]), sys.argv[2]
feats = {}
def feature(f):
    if f not in feats:
        feats[f] = subprocess.run([criu, 'check', '--feature', f], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL).returncode == 0
    return feats[f]
excluded = ('route_rules', 'criu-rtc.so')          # test/zdtm.desc's exclusions
for n in sorted(os.listdir(static)):
    p = os.path.join(static, n)
    if os.path.islink(p) or not os.path.isfile(p) or not os.stat(p).st_mode & 0o100:
        continue
    if n.endswith(('.checkskip', '.hook')) or n in excluded:
        continue
    d = {}
    if os.path.exists(p + '.desc') and os.path.getsize(p + '.desc') > 0:
        d = eval(open(p + '.desc').read())
    flags = d.get('flags', '').split()
    why = ''
    if d.get('arch', platform.machine()) != platform.machine():
        why = 'for another architecture (%s)' % d['arch']
    elif 'noauto' in flags:
        why = 'noauto (run by hand only)'
    elif 'h' not in d.get('flavor', 'h ns uns').split():
        why = 'runs only in a new namespace (flavor %s)' % d['flavor']
    else:
        for f in d.get('feature', '').split():
            if not feature(f):
                why = 'kernel feature %s missing' % f
                break
    if not why and os.access(p + '.checkskip', os.X_OK):
        r = subprocess.run([p + '.checkskip'], cwd=os.path.dirname(os.path.dirname(static)),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if r.returncode != 0:
            why = 'its .checkskip says this machine cannot run it'
    kind = 'skip' if why else ('crfail' if 'crfail' in flags else 'run')
    print('\t'.join([n, kind, why or '-', ' '.join(flags) or '-', d.get('opts', '') or '-',
                     d.get('dopts', '') or '-', d.get('ropts', '') or '-']))
EOF

declare -A KIND WHY FLAGS OPTS DOPTS ROPTS
while IFS=$'\t' read -r n k w f o d r; do
    KIND[$n]=$k WHY[$n]=$w FLAGS[$n]=$f OPTS[$n]=$o DOPTS[$n]=$d ROPTS[$n]=$r
done < "$SCRATCH/tests.tsv"
if [ $# -gt 0 ]; then
    tests=("$@")
    for t in "${tests[@]}"; do
        [ -n "${KIND[$t]:-}" ] || { echo "conformance.sh: no static test $t in $STATIC" >&2; exit 1; }
    done
    DOC=${DOC:-$SCRATCH/CONFORMANCE.md}
else
    mapfile -t tests < <(awk -F'\t' '$2 != "skip" {print $1}' "$SCRATCH/tests.tsv")
    DOC=${DOC:-$REPO/docs/CONFORMANCE.md}
fi

# The machine's iptables rules as the run found them, put back after each test: a test that
# adds one and is ended before it removes it (a DROP of port 8880 was left in session 34) would
# fail every later test that uses that port.
FIREWALL_AT_START=$(iptables-save 2> /dev/null | grep -v '^#' || true)
# None at all: an empty filter table (iptables-restore flushes the tables it is given).
[ -n "$FIREWALL_AT_START" ] || FIREWALL_AT_START=$(printf '*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT')
reset_firewall() {
    local now
    now=$(iptables-save 2> /dev/null | grep -v '^#' || true)
    [ "$now" = "$FIREWALL_AT_START" ] || printf '%s\n' "$FIREWALL_AT_START" | iptables-restore 2> /dev/null || true
}

# The tests' environment, in TENV (zdtm.py's: a test not flagged suid drops to these ids once
# set up), with the mark that finds its processes; $3 = suid: as root throughout.
test_env() {
    TENV=("TMPDIR=$2/tmp" ZDTM_THREAD_BOMB=5 "CONF_MARK=$2")
    case " ${FLAGS[$1]} ${3:-} " in
        *" suid "*) ;;
        *) TENV+=(ZDTM_UID=18943 ZDTM_GID=58467 "ZDTM_GROUPS=27495 48244") ;;
    esac
}

# The test's command line, from the static Makefile's rule for NAME.pid.
test_cmd() {
    make -s -n --no-print-directory -C "$STATIC" "$1.pid" 2> /dev/null | grep "^\./$1 " | tail -1
}

# The wrapper: the job's main process under ckpt (pid 1 of the namespace without it). Runs the
# test in its directory, waits for $term, sends SIGTERM to the test, waits for its end.
WRAP=$SCRATCH/wrap.sh
cat > "$WRAP.new" <<'EOF'
#!/bin/bash
# conformance.sh's wrapper: wrap.sh TERMFILE NAME COMMAND... (cwd: the test's directory)
term=$1 name=$2
shift 2
"$@"
rc=$?
if [ ! -s "$name.pid" ]; then
    echo "wrap: $name did not start (exit status $rc)"
    exit 1
fi
pid=$(cat "$name.pid")
echo "wrap: $name started, pid $pid"
while [ ! -e "$term" ]; do sleep 0.2; done
kill -TERM "$pid"
# The test is not our child (it daemonized), or is one we adopted: gone or a zombie is its end.
while [ -e "/proc/$pid" ] && [ "$(cut -d' ' -f3 "/proc/$pid/stat" 2> /dev/null)" != Z ]; do sleep 0.1; done
echo "wrap: $name ended"
exit 0
EOF
chmod 755 "$WRAP.new"
mv "$WRAP.new" "$WRAP"

# Every process of the test in $1 (its directory): those carrying its mark in their
# environment, or whose working directory or root is under it.
procs_of() {
    local r=$1
    {
        grep -lsxzF "CONF_MARK=$r" /proc/[0-9]*/environ
        find /proc -mindepth 2 -maxdepth 2 \( -name cwd -o -name root \) \( -lname "$r/*" -o -lname "$r" \)
    } 2> /dev/null | cut -d/ -f3 | grep -vx "$$" | sort -u || true
}

# Ends everything of the test in $1: its process groups ($2...), its processes, its mounts,
# its cgroups.
end_test() {
    local r=$1 g pids i
    shift
    for g in "$@"; do kill -KILL -- "-$g" 2> /dev/null || true; done
    for i in 1 2 3 4 5; do
        pids=$(procs_of "$r")
        [ -n "$pids" ] || break
        # shellcheck disable=SC2086
        kill -KILL $pids 2> /dev/null || true
        sleep 0.2
    done
    [ -z "$(procs_of "$r")" ] || echo "conformance.sh: processes of $r left: $(procs_of "$r" | tr '\n' ' ')" >&2
    awk '{print $5}' /proc/self/mountinfo | grep -F "$r/" | sort -r | while read -r m; do
        umount -l "$(printf '%b' "$m")" 2> /dev/null || true
    done
    # The cgroups the cgroup tests make (zdtmtst...), once empty; their hooks leave some.
    find /sys/fs/cgroup -depth -mindepth 2 -type d -path '*/zdtmtst*' -exec rmdir {} + 2> /dev/null || true
}

# Prepares the directory $2 of test $1: t/ (the test's cwd, writable by the test's ids), tmp/, and
# h/zdtm/static -> t (the test's binary copied into t/) (hooks run in h/, as CRIU's runner runs them from test/).
fresh_dir() {
    local n=$1 r=$2
    rm -rf "$r/t" "$r/tmp" "$r/h" "$r/term" "$r/ckpt.d"
    mkdir -p "$r/t" "$r/tmp" "$r/h/zdtm"
    chmod 777 "$r/t"
    chmod 1777 "$r/tmp"
    ln -s "$r/t" "$r/h/zdtm/static"
    cp "$STATIC/$n" "$r/t/"
}

# Runs the test's hook, if it has one, with its argument $3; logs to hooks.log.
hook() {
    local n=$1 r=$2 arg=$3
    [ -x "$STATIC/$n.hook" ] || return 0
    echo "== hook $arg" >> "$r/hooks.log"
    (cd "$r/h" && timeout 30 "$STATIC/$n.hook" "$arg") >> "$r/hooks.log" 2>&1 ||
        echo "== hook $arg failed (exit status $?)" >> "$r/hooks.log"
}

# wait_for SECONDS COMMAND...: polls COMMAND every 0.1 s; false when SECONDS passed.
wait_for() {
    local end=$((SECONDS + $1))
    shift
    until "$@"; do
        [ $SECONDS -lt $end ] || return 1
        sleep 0.1
    done
}
started_or_gone() { [ -s "$1" ] || ! kill -0 "$2" 2> /dev/null; }
gone() { ! kill -0 "$1" 2> /dev/null; }
result_there() { [ -e "$1" ] || ! kill -0 "$2" 2> /dev/null; }

# The test's verdict from its output file $1: "PASS", or "FAIL<TAB>its words".
verdict() {
    local out=$1 words
    if [ -e "$out" ] && tr -s ' \t' '\n\n' < "$out" | grep -qx PASS; then
        echo PASS
        return
    fi
    [ -e "$out" ] || out=$out.inprogress
    # The test's lines, without their time and pid: the first error, then the last FAIL.
    words=$( { grep -m1 -E 'ERR|FAIL|[Ee]rror|[Ff]ail' "$out" 2> /dev/null || true
               grep -E 'FAIL' "$out" 2> /dev/null | tail -1 || true; } |
        sed -E 's/^[0-9:. ]+: *[0-9]+: *//; s/^FAIL: //' | awk '!seen[$0]++' | tr '\n' ' ' | cut -c1-300)
    [ -e "$out" ] || words="no output file"
    printf 'FAIL\t%s\n' "${words:-its output has no PASS: $(tail -c 200 "$out" | tr '\n' ' ')}"
}

# ckpt's message in log $1: its last line saying `ckpt:` (or the last line).
ckpt_msg() {
    local m
    m=$(grep -E '^ckpt:|ERROR|error' "$1" 2> /dev/null | tail -1)
    [ -n "$m" ] || m=$(tail -1 "$1" 2> /dev/null)
    echo "$m" | cut -c1-400
}

# Host pid of the test whose namespace pid is in $2 (directory $1); for hooks only.
host_pid() {
    local r=$1 want p
    want=$(cat "$r/t/$2.pid" 2> /dev/null) || return 0
    for p in $(procs_of "$r"); do
        [ "$(awk '/^NSpid:/ {print $NF}' "/proc/$p/status" 2> /dev/null)" = "$want" ] && { echo "$p"; return; }
    done
}

# run_base NAME DIR: the test without ckpt. Prints "PASS" or "CLASS<TAB>reason".
run_base() {
    local n=$1 r=$2 cmd pid res
    cmd=$(test_cmd "$n")
    fresh_dir "$n" "$r"
    test_env "$n" "$r"
    # shellcheck disable=SC2086
    (cd "$r/t" && exec env "${TENV[@]}" setsid unshare --pid --fork --mount --mount-proc \
        --propagation private --kill-child "$WRAP" "$r/term" "$n" $cmd) < /dev/null > "$r/base.log" 2>&1 &
    pid=$!
    hook "$n" "$r" --post-start
    if ! wait_for 30 started_or_gone "$r/t/$n.pid" "$pid" || ! [ -s "$r/t/$n.pid" ]; then
        res=$(printf 'no-start\t%s' "$(tail -c 300 "$r/base.log" | tr '\n' ' ')")
    else
        touch "$r/term"
        if wait_for "$TIMEOUT" gone "$pid"; then
            res=$(verdict "$r/t/$n.out")
        else
            res=$(printf 'timeout\tno verdict in %s s' "$TIMEOUT")
        fi
    fi
    end_test "$r" "$pid"
    hook "$n" "$r" --clean
    reset_firewall
    cp "$r/t/$n.out" "$r/base.out" 2> /dev/null || cp "$r/t/$n.out.inprogress" "$r/base.out" 2> /dev/null || true
    echo "$res"
}

# run_ckpt NAME DIR: the test under ckpt. Prints "PASS" or "CLASS<TAB>reason".
run_ckpt() {
    local n=$1 r=$2 cmd lpid rpid="" res rc
    cmd=$(test_cmd "$n")
    fresh_dir "$n" "$r"
    test_env "$n" "$r"
    # shellcheck disable=SC2086
    (cd "$r/t" && exec env "${TENV[@]}" setsid "$CKPT" launch --dir "$r/ckpt.d" -- \
        "$WRAP" "$r/term" "$n" $cmd) < /dev/null > "$r/launch.log" 2>&1 &
    lpid=$!
    hook "$n" "$r" --post-start
    if ! wait_for 30 started_or_gone "$r/t/$n.pid" "$lpid" || ! [ -s "$r/t/$n.pid" ]; then
        res=$(printf 'no-start\t%s' "$(ckpt_msg "$r/launch.log")")
    else
        export ZDTM_TEST_PID
        ZDTM_TEST_PID=$(host_pid "$r" "$n")
        hook "$n" "$r" --pre-dump
        rc=0
        timeout 60 "$CKPT" checkpoint --dir "$r/ckpt.d" --kill > "$r/checkpoint.log" 2>&1 || rc=$?
        if [ $rc != 0 ]; then
            [ $rc != 124 ] || echo "conformance.sh: checkpoint timed out after 60 s" >> "$r/checkpoint.log"
            res=$(printf 'refused\t%s' "$(ckpt_msg "$r/checkpoint.log")")
        elif ! wait_for 30 gone "$lpid"; then
            res=$(printf 'refused\tthe job still runs 30 s after checkpoint --kill')
        else
            hook "$n" "$r" --pre-restore
            (cd "$r" && exec env CONF_MARK="$r" setsid "$CKPT" restart --dir "$r/ckpt.d") \
                < /dev/null > "$r/restart.log" 2>&1 &
            rpid=$!
            touch "$r/term"
            if ! wait_for "$TIMEOUT" result_there "$r/t/$n.out" "$rpid"; then
                res=$(printf 'timeout\tno verdict %s s after the restart began; %s' "$TIMEOUT" \
                    "$(ckpt_msg "$r/restart.log")")
            else
                # The test wrote its verdict, or the restart ended: let both finish.
                wait_for 10 gone "$rpid" || true
                rc=0
                gone "$rpid" && { wait "$rpid" || rc=$?; }
                if [ -e "$r/t/$n.out" ]; then
                    res=$(verdict "$r/t/$n.out")
                elif [ $rc != 0 ]; then
                    res=$(printf 'restart-failed\t%s' "$(ckpt_msg "$r/restart.log")")
                else
                    res=$(verdict "$r/t/$n.out")
                fi
            fi
        fi
        unset ZDTM_TEST_PID
    fi
    end_test "$r" "$lpid" $rpid
    hook "$n" "$r" --clean
    reset_firewall
    cp "$r/t/$n.out" "$r/ckpt.out" 2> /dev/null || cp "$r/t/$n.out.inprogress" "$r/ckpt.out" 2> /dev/null || true
    echo "$res"
}

# run_criu NAME DIR: the test through CRIU 4.2 on the same driver (started in the host's
# namespaces, as zdtm.py's host flavor does). Prints "PASS" or "CLASS<TAB>reason".
run_criu() {
    local n=$1 r=$2 cmd pid tpid res rc img
    cmd=$(test_cmd "$n")
    fresh_dir "$n" "$r"
    # The images where zdtm.py keeps them, six levels below where the hooks run (an option in
    # a .desc names a path relative to it: cgroup_yard's --cgroup-yard); CRIU runs there.
    img=$r/h/dump/zdtm/static/$n/pid/1
    mkdir -p "$img"
    # As root: CRIU's dump reads a process's rlimits with prlimit, which takes CAP_SYS_RESOURCE
    # for a process of another user, and a container may not give root that capability.
    test_env "$n" "$r" "$CRIU_AS"
    # shellcheck disable=SC2086
    (cd "$r/t" && exec env "${TENV[@]}" setsid $cmd) < /dev/null > "$r/criu-test.log" 2>&1 &
    pid=$!
    hook "$n" "$r" --post-start
    if ! wait_for 30 started_or_gone "$r/t/$n.pid" "$pid" || ! [ -s "$r/t/$n.pid" ]; then
        res=$(printf 'no-start\t%s' "$(tail -c 300 "$r/criu-test.log" | tr '\n' ' ')")
    else
        tpid=$(cat "$r/t/$n.pid")
        export ZDTM_TEST_PID=$tpid
        hook "$n" "$r" --pre-dump
        rc=0
        # shellcheck disable=SC2086
        (cd "$img" && timeout 60 "$CRIU_BIN" dump -t "$tpid" -D "$img" -o dump.log -v4 \
            --pidfile "$r/t/$n.pid" $(opt "${OPTS[$n]}") $(opt "${DOPTS[$n]}")) > "$r/criu-dump.out" 2>&1 || rc=$?
        cp "$img/dump.log" "$r/criu-dump.log" 2> /dev/null || true
        if [ $rc != 0 ]; then
            res=$(printf 'refused\t%s' "$(criu_msg "$r/criu-dump.log")")
        else
            wait_for 30 gone "$tpid" || true
            hook "$n" "$r" --pre-restore
            rm -f "$r/t/$n.pid"
            (cd "$img" && timeout 60 "$CRIU_BIN" restore -D "$img" -o restore.log -v4 -d \
                --pidfile "$r/t/$n.pid" $(opt "${OPTS[$n]}") $(opt "${ROPTS[$n]}")) > "$r/criu-restore.out" 2>&1 || rc=$?
            cp "$img/restore.log" "$r/criu-restore.log" 2> /dev/null || true
            if [ $rc != 0 ]; then
                res=$(printf 'restart-failed\t%s' "$(criu_msg "$r/criu-restore.log")")
            else
                tpid=$(cat "$r/t/$n.pid")
                kill -TERM "$tpid" 2> /dev/null || true
                if wait_for "$TIMEOUT" result_there "$r/t/$n.out" "$tpid"; then
                    wait_for 10 gone "$tpid" || true
                    res=$(verdict "$r/t/$n.out")
                else
                    res=$(printf 'timeout\tno verdict in %s s' "$TIMEOUT")
                fi
            fi
        fi
        unset ZDTM_TEST_PID
    fi
    end_test "$r" "$pid"
    hook "$n" "$r" --clean
    reset_firewall
    cp "$r/t/$n.out" "$r/criu.out" 2> /dev/null || cp "$r/t/$n.out.inprogress" "$r/criu.out" 2> /dev/null || true
    echo "$res"
}
opt() { [ "$1" = - ] || echo "$1"; }
# CRIU's first error in log $1 (but the rlimit it could not raise for itself, which it survives).
criu_msg() { grep Error "$1" 2> /dev/null | grep -v "RLIMIT_NOFILE for self" | head -1 | sed 's/^([0-9.]*) //' | cut -c1-300; }
CRIU_AS=
grep -q '^CapEff:.*' /proc/self/status &&
    [ $(( 0x$(awk '/^CapEff/ {print $2}' /proc/self/status) >> 24 & 1 )) = 1 ] || CRIU_AS=suid



# Interrupted (bash runs this once the test under way has ended): its leftovers ended, the
# report of what ran written.
trap 'echo "conformance.sh: interrupted" >&2; [ -z "${cur:-}" ] || end_test "$cur"; report final; exit 130' INT TERM

# Results: name, group, kind, base class, base reason, ckpt class, ckpt reason, criu class, reason.
results=$SCRATCH/results.tsv
: > "$results"
echo 0 > "$SCRATCH/waited"
# What the report says of the run.
export REPORT_KERNEL="$(uname -r)" REPORT_COMMIT=$CKPT_COMMIT REPORT_CMD="bench/conformance.sh${*:+ $*}" \
    REPORT_CRIU=$CRIU REPORT_CPUS=$(nproc) REPORT_TIMEOUT=$TIMEOUT REPORT_CRIU_AS=$CRIU_AS \
    REPORT_STARTED=$started REPORT_TOTAL=${#tests[@]} REPORT_DOC=$DOC
declare -px REPORT_KERNEL REPORT_COMMIT REPORT_CMD REPORT_CRIU REPORT_CPUS REPORT_TIMEOUT REPORT_CRIU_AS \
    REPORT_STARTED REPORT_TOTAL REPORT_DOC > "$SCRATCH/meta.sh"
printf '%-30s %4s %-10s %-8s %s\n' TEST TIME GROUP ALONE CKPT
for n in "${tests[@]}"; do
    # Another suite running on this machine goes first (YIELD_TO: its command line, for pgrep -f).
    if [ -n "${YIELD_TO:-}" ] && pgrep -f "$YIELD_TO" > /dev/null; then
        echo "(waiting while '$YIELD_TO' runs)"
        w0=$SECONDS
        while pgrep -f "$YIELD_TO" > /dev/null; do sleep 30; done
        echo $(( $(cat "$SCRATCH/waited") + SECONDS - w0 )) > "$SCRATCH/waited"
    fi
    cur=$RUN/$n t0=$SECONDS
    mkdir -p "$cur"
    g=$(group_of "$n")
    IFS=$'\t' read -r bc br <<< "$(run_base "$n" "$cur")"
    IFS=$'\t' read -r cc cr <<< "$(run_ckpt "$n" "$cur")"
    rc_="-" rr="-"
    [ "$CRIU" != 1 ] || IFS=$'\t' read -r rc_ rr <<< "$(run_criu "$n" "$cur")"
    rm -rf "$cur/t" "$cur/tmp" "$cur/h" "$cur/ckpt.d" "$cur/term"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$n" "$g" "${KIND[$n]}" "$bc" "${br:--}" "$cc" "${cr:--}" \
        "$rc_" "${rr:--}" >> "$results"
    line=$(printf '%-30s %3ss %-10s %-8s %s' "$n" $((SECONDS - t0)) "$g" "$bc" "$cc${cr:+: $cr}")
    [ "$CRIU" != 1 ] || line+="  [criu: $rc_${rr:+: ${rr:0:80}}]"
    echo "${line:0:220}"
    report partial
done
cur=
report final
