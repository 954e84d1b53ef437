#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| profiler::fuzz::sched_record(data));
