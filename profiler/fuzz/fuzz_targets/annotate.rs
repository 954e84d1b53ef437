#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| profiler::fuzz::annotate(data));
