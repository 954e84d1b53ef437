#![no_std]
// This library exists only so that `profiler` can have a build-dependency on this crate, which makes
// cargo rebuild the embedded BPF object when the kernel programs change.
