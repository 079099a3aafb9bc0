package main

import (
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTick is Linux's USER_HZ: /proc CPU times are in 1/100 s.
const clockTick = 10 * time.Millisecond

// procCPU returns the user+system CPU time of the processes: by pid, or
// every process whose /proc/<pid>/comm is comm (nginx and HAProxy run
// several).
func procCPU(pids []int) time.Duration {
	var total time.Duration
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			continue
		}
		// Fields after the ")" that ends the command name: state is 3rd,
		// utime 14th, stime 15th of the whole line.
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		if len(f) < 13 {
			continue
		}
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		total += time.Duration(ut+st) * clockTick
	}
	return total
}

// procPeakRSS returns the summed peak resident set (VmHWM) of the pids.
func procPeakRSS(pids []int) int64 {
	var total int64
	for _, pid := range pids {
		total += procMemory(pid, "VmHWM:")
	}
	return total
}

// procMemory returns a memory figure of /proc/<pid>/status (VmRSS:,
// VmHWM:, …) in bytes; 0 when there is none.
func procMemory(pid int, field string) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == field {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// pidsByComm lists the processes whose command name is comm.
func pidsByComm(comm string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile("/proc/" + e.Name() + "/comm"); err == nil && strings.TrimSpace(string(b)) == comm {
			pids = append(pids, pid)
		}
	}
	return pids
}
