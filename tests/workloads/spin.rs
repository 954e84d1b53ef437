//! Rust test workload: `spin SECONDS` spends 70% of its CPU time in `burn_x`, 30% in `burn_y`,
//! measured by itself, for SECONDS of its CPU time. Built with `-C force-frame-pointers=yes`. Prints at exit:
//!   TRUTH pid=<pid> burn_x=<ns> burn_y=<ns>
fn thread_ns() -> i64 {
    let mut ts = Timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { clock_gettime(3 /* CLOCK_THREAD_CPUTIME_ID */, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

extern "C" {
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
}

macro_rules! burn {
    ($budget:expr) => {{
        let t0 = thread_ns();
        let mut acc = 0u64;
        loop {
            for i in 0..400_000u64 {
                // Plain operators (they wrap in release builds) and an empty asm barrier: no std
                // helper is inlined here, so every sample's leaf is the burn function itself.
                acc += i * 2654435761;
                unsafe { std::arch::asm!("/* {0} */", inout(reg) acc) };
            }
            let t = thread_ns();
            if t - t0 >= $budget {
                break t - t0;
            }
        }
    }};
}

#[inline(never)]
fn burn_x(budget: i64) -> i64 {
    burn!(budget)
}

#[inline(never)]
fn burn_y(budget: i64) -> i64 {
    burn!(budget)
}

#[inline(never)]
fn run(seconds: f64) -> (i64, i64) {
    let end = thread_ns() + (seconds * 1e9) as i64;
    let (mut x, mut y) = (0, 0);
    while thread_ns() < end {
        x += burn_x(35_000_000);
        y += burn_y(15_000_000);
    }
    (x, y)
}

fn main() {
    let seconds: f64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let (x, y) = run(seconds);
    println!("TRUTH pid={} burn_x={x} burn_y={y}", std::process::id());
}
