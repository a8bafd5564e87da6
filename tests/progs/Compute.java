/* Compute.java: a deterministic computation on a Java virtual machine, for checkpoint/restart
 * tests.
 *
 * Checks that a running JVM (some twenty threads of its own: the JIT compilers, the garbage
 * collector's, the signal dispatcher; a pool of four workers; a heap the collector moves) survives
 * checkpoint/restart: each step hands four slices of a hash chain to the pool, folds their
 * answers into the chain and a map shared with the workers, keeps some garbage alive and drops
 * the rest (the collector runs during the run, and is asked to every hundred steps), then
 * sleeps 10 ms. Prints START, then RESULT <hex> (equal to an uninterrupted run's) and PASS if
 * the pool's answers agree with the same work done again on the main thread at the end.
 *
 * Usage: java -cp DIR Compute [SECONDS=5]
 */
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

public class Compute {
    static final int STEP_MS = 10;
    static final int WORKERS = 4;

    /* One worker's slice: a splitmix64 chain of 20000 rounds from its seed. */
    static long slice(long seed) {
        long h = seed;
        for (int i = 0; i < 20000; i++) {
            h += 0x9E3779B97F4A7C15L;
            long z = h;
            z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
            z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
            h ^= z ^ (z >>> 31);
        }
        return h;
    }

    public static void main(String[] args) throws Exception {
        System.out.println("START");
        double secs = args.length > 0 ? Double.parseDouble(args[0]) : 5.0;
        int steps = Math.max(1, (int) (secs * 1000 / STEP_MS));
        ExecutorService pool = Executors.newFixedThreadPool(WORKERS);
        Map<Integer, Long> shared = new ConcurrentHashMap<>();
        List<long[]> kept = new ArrayList<>();
        long chain = 0x636B7074L;
        for (int s = 0; s < steps; s++) {
            List<Future<Long>> answers = new ArrayList<>();
            for (int w = 0; w < WORKERS; w++) {
                final long seed = chain + w;
                final int key = (s * WORKERS + w) % 1009;
                answers.add(pool.submit(() -> {
                    long a = slice(seed);
                    shared.put(key, a);
                    return a;
                }));
            }
            for (Future<Long> f : answers)
                chain = chain * 31 + f.get();
            long[] garbage = new long[2048 + s % 512];
            garbage[s % garbage.length] = chain;
            if (s % 8 == 0)
                kept.add(garbage);
            if (kept.size() > 64)
                kept.remove(0);
            if (s % 100 == 99)
                System.gc();
            Thread.sleep(STEP_MS);
        }
        pool.shutdown();
        /* The same chain on this thread alone, and the map against it. */
        long again = 0x636B7074L;
        Map<Integer, Long> expected = new java.util.HashMap<>();
        for (int s = 0; s < steps; s++) {
            long before = again;
            for (int w = 0; w < WORKERS; w++) {
                long a = slice(before + w);
                again = again * 31 + a;
                expected.put((s * WORKERS + w) % 1009, a);
            }
        }
        boolean ok = again == chain && expected.equals(shared);
        long h = chain;
        for (long[] g : kept)
            h = h * 1000003 + g.length;
        System.out.println("RESULT " + String.format("%016x", h));
        System.out.println(ok ? "PASS" : "FAIL the pool's chain or map differs from the work done again");
        System.exit(ok ? 0 : 1);
    }
}
