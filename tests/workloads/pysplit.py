"""Python workload for bpfprof's Python frames: its main thread alternates alpha_work (a loop of
arithmetic in Python) and beta_work (a list built in Python, then sorted by the interpreter's C
sort, the list handed back so that it is freed after the measured call); a second thread spins in gamma_work until the main thread is done. Each function's CPU
time is measured by its own thread's clock around each call.

    python pysplit.py SECONDS [DEPTH]
    python pysplit.py fixed ROUNDS

With DEPTH, alpha_work is reached through a recursion DEPTH deep (deep stacks). `fixed` runs
ROUNDS of alpha_work and beta_work on the main thread alone and prints ELAPSED=ns, its own
elapsed time (benchmarks).

Otherwise prints TRUTH pid, each thread's native id, alpha_cpu, beta_cpu, gamma_cpu, process_cpu (seconds),
and the first and last line of alpha_work's and beta_work's bodies.
"""
import os
import sys
import threading
import time


def alpha_work(n):
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def beta_work(n):
    data = [(i * 7919) % 10007 for i in range(n)]
    data.sort()
    return data


def gamma_work(stop, spent):
    x = 0
    start = time.thread_time()
    while not stop.is_set():
        for i in range(5000):
            x ^= i
    spent.append(time.thread_time() - start)


def nested(depth, n):
    if depth <= 0:
        return alpha_work(n)
    return nested(depth - 1, n)


def lines_of(function):
    code = function.__code__
    # A frame made but not started yet is at its `def` line, as CPython's own f_lineno says
    # (3.10's f_lasti -1; 3.11+ list it in co_lines() as their RESUME's line).
    lines = [line for _, _, line in code.co_lines() if line is not None] + [code.co_firstlineno]
    return min(lines), max(lines)


def fixed(rounds):
    start = time.monotonic_ns()
    for _ in range(rounds):
        alpha_work(20000)
        beta_work(20000)
    print(f"ELAPSED={time.monotonic_ns() - start}", flush=True)


def main():
    if sys.argv[1] == "fixed":
        return fixed(int(sys.argv[2]))
    seconds = float(sys.argv[1])
    depth = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    stop, spent, gamma_tid = threading.Event(), [], []

    def gamma():
        gamma_tid.append(threading.get_native_id())
        gamma_work(stop, spent)

    thread = threading.Thread(target=gamma)
    process_start = time.process_time()
    thread.start()
    alpha_cpu = beta_cpu = 0.0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.thread_time()
        nested(depth, 20000)
        t1 = time.thread_time()
        kept = beta_work(20000)
        t2 = time.thread_time()
        del kept  # freed outside the measured call: its frame is gone when its list is freed
        alpha_cpu += t1 - t0
        beta_cpu += t2 - t1
    stop.set()
    thread.join()
    process_cpu = time.process_time() - process_start
    (alpha_first, alpha_last), (beta_first, beta_last) = lines_of(alpha_work), lines_of(beta_work)
    print(
        f"TRUTH pid={os.getpid()} main_tid={threading.get_native_id()} gamma_tid={gamma_tid[0]} "
        f"alpha_cpu={alpha_cpu:.6f} beta_cpu={beta_cpu:.6f} gamma_cpu={spent[0]:.6f} "
        f"process_cpu={process_cpu:.6f} alpha_first={alpha_first} alpha_last={alpha_last} "
        f"beta_first={beta_first} beta_last={beta_last} depth={depth}",
        flush=True,
    )


main()
