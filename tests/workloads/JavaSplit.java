// Java workload for JIT frames named from the JVM's perf map: the main thread calls alphaWork,
// betaWork and gammaWork in turn, about 60/30/10 of its time, each call measured by the thread's
// own CPU clock. Once they are compiled (after WARM_UP_NS), it sleeps past the profiler's next
// drain (its samples so far are placed while no map names them: [anon]), asks its own JVM to
// write the perf map (`jcmd PID Compiler.perfmap`, as a user would), and measures from then on,
// writing the map again every REMAP_NS for code compiled since. Run with -XX:+PreserveFramePointer and
// -XX:CompileCommand=dontinline,JavaSplit::*Work (each function its own frame).
//
//     java -cp DIR JavaSplit SECONDS
//
// Prints TRUTH pid, main_tid (this thread's), alpha_cpu, beta_cpu, gamma_cpu (ns), and perfmap=0 once the map
// is written (the jcmd's exit status).
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;

public class JavaSplit {
    static final long WARM_UP_NS = 700_000_000L;
    static final long QUIET_MS = 1_500;
    static final long REMAP_NS = 1_000_000_000L;

    /// `jcmd PID Compiler.perfmap`: its exit status.
    static int writePerfMap(long pid) throws Exception {
        return new ProcessBuilder("jcmd", Long.toString(pid), "Compiler.perfmap")
                .redirectOutput(ProcessBuilder.Redirect.DISCARD)
                .start()
                .waitFor();
    }

    static long alphaWork(int n) {
        long total = 0;
        for (int i = 0; i < n; i++) {
            total += (long) i * i % 7;
        }
        return total;
    }

    static long betaWork(int n) {
        long total = 0;
        for (int i = 0; i < n; i++) {
            total += (long) Math.sqrt(i);
        }
        return total;
    }

    static long gammaWork(int n) {
        long total = 0;
        for (int i = 0; i < n; i++) {
            total ^= ((long) i << 3) + (i >> 2);
        }
        return total;
    }

    public static void main(String[] args) throws Exception {
        ThreadMXBean clock = ManagementFactory.getThreadMXBean();
        long pid = ProcessHandle.current().pid();
        // The launcher's first thread only starts the JVM: this one is another, its tid its own.
        String tid = java.nio.file.Files.readSymbolicLink(java.nio.file.Paths.get("/proc/thread-self"))
                .getFileName()
                .toString();
        long start = System.nanoTime();
        long end = start + (long) (Double.parseDouble(args[0]) * 1e9);
        long alpha = 0, beta = 0, gamma = 0, sink = 0;
        int mapped = -1;
        long mappedAt = 0;
        while (System.nanoTime() < end) {
            long t0 = clock.getCurrentThreadCpuTime();
            sink += alphaWork(900_000);
            long t1 = clock.getCurrentThreadCpuTime();
            sink += betaWork(220_000);
            long t2 = clock.getCurrentThreadCpuTime();
            sink += gammaWork(330_000);
            long t3 = clock.getCurrentThreadCpuTime();
            alpha += t1 - t0;
            beta += t2 - t1;
            gamma += t3 - t2;
            if (mapped < 0 && System.nanoTime() - start > WARM_UP_NS) {
                Thread.sleep(QUIET_MS);
                mapped = writePerfMap(pid);
                mappedAt = System.nanoTime();
                // Measured from here: the functions compiled so far are named from now on.
                alpha = beta = gamma = 0;
            } else if (mapped == 0 && System.nanoTime() - mappedAt > REMAP_NS) {
                mapped = writePerfMap(pid);
                mappedAt = System.nanoTime();
            }
        }
        System.out.println("TRUTH pid=" + pid + " main_tid=" + tid + " alpha_cpu=" + alpha + " beta_cpu=" + beta
                + " gamma_cpu=" + gamma + " perfmap=" + mapped + " sink=" + (sink & 1));
    }
}
