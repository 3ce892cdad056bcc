package app

import (
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
)

// MemoryLimitEnv names the environment variable that carries the
// container's own memory limit in bytes (config/manager sets it with the
// downward API: resourceFieldRef limits.memory).
const MemoryLimitEnv = "HOOKWRIGHT_MEMORY_LIMIT"

// memoryLimitShare is the share of the container limit given to the Go
// runtime as its soft limit: the GC works harder near it, before the
// kernel's OOM killer would act (linkerd2 #9947, Mellanox
// network-operator #3173: next_gc above the cgroup limit).
const memoryLimitShare = 0.9

// SoftMemoryLimit is the soft limit for the Go runtime from the
// container's limit in bytes (env MemoryLimitEnv): 90 % of it. It is 0
// (none to set) when GOMEMLIMIT is set (the runtime already follows it) or
// the variable is unset; an unparsable value or one that is not positive
// is an error. Without a container limit the downward API reports the
// node's allocatable memory, which is still a bound.
func SoftMemoryLimit(getenv func(string) string) (int64, error) {
	if getenv("GOMEMLIMIT") != "" {
		return 0, nil
	}
	v := getenv(MemoryLimitEnv)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s=%q: want the container's memory limit in bytes", MemoryLimitEnv, v)
	}
	return int64(float64(n) * memoryLimitShare), nil
}

// SetSoftMemoryLimit applies SoftMemoryLimit from the process environment
// (runtime/debug.SetMemoryLimit) and returns the limit set, 0 for none.
func SetSoftMemoryLimit() (int64, error) {
	n, err := SoftMemoryLimit(os.Getenv)
	if err != nil || n == 0 {
		return 0, err
	}
	debug.SetMemoryLimit(n)
	return n, nil
}
