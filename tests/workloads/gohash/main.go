// Go test workload: `gohash SECONDS PROFILE` hashes with crypto/sha256 in hashWork (its
// assembly uses RBP as an ordinary register: a frame-pointer walk loses its callers) and spins in
// spinWork, and reads the clock in nowWork (time.Now: the vDSO, reached from assembly that moves
// to the system stack), for SECONDS of wall time, on one OS thread whose CPU clock times each call; Go's own
// profiler (runtime/pprof, at 500 Hz) writes the run's CPU profile to PROFILE meanwhile. Prints at
// exit:
//   TRUTH pid=<pid> hash=<ns of the thread's CPU time in hashWork> spin=<ns in spinWork>
//   now=<ns in nowWork> gominor=<the Go release it was built with: 19 for go1.19.8>
package main

import (
	"crypto/sha256"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

// The calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID), in ns.
func threadNs() int64 {
	var ts syscall.Timespec
	syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 3, uintptr(unsafe.Pointer(&ts)), 0)
	return ts.Nano()
}

//go:noinline
func hashWork(buf []byte) [32]byte {
	var sum [32]byte
	for i := 0; i < 100; i++ {
		sum = sha256.Sum256(buf)
		buf[0] = sum[0]
	}
	return sum
}

//go:noinline
func spinWork(n int) int {
	x := 0
	for i := 0; i < n; i++ {
		x += i * i % 7
	}
	return x
}

//go:noinline
func nowWork(n int) int64 {
	var x int64
	for i := 0; i < n; i++ {
		x += time.Now().UnixNano() & 1
	}
	return x
}

func main() {
	seconds, err := strconv.ParseFloat(os.Args[1], 64)
	if err != nil {
		panic(err)
	}
	out, err := os.Create(os.Args[2])
	if err != nil {
		panic(err)
	}
	// Before StartCPUProfile, which then keeps this rate (and says so on stderr).
	runtime.SetCPUProfileRate(500)
	if err := pprof.StartCPUProfile(out); err != nil {
		panic(err)
	}
	runtime.LockOSThread()
	buf := make([]byte, 64<<10)
	end := time.Now().Add(time.Duration(seconds * float64(time.Second)))
	var hash, spin, now int64
	x := 0
	for time.Now().Before(end) {
		t0 := threadNs()
		s := hashWork(buf)
		t1 := threadNs()
		x += spinWork(5000000) + int(s[0])
		t2 := threadNs()
		x += int(nowWork(100000))
		hash, spin, now = hash+t1-t0, spin+t2-t1, now+threadNs()-t2
	}
	pprof.StopCPUProfile()
	out.Close()
	gominor := strings.Split(runtime.Version(), ".")[1]
	fmt.Printf("TRUTH pid=%d hash=%d spin=%d now=%d gominor=%s sink=%d\n", os.Getpid(), hash, spin, now, gominor, x)
}
