package datapath

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// explainMapCreate adds the kernel's own answer to a failed creation of a
// u32 array map (maxEntries, flags). cilium/ebpf reports a failed creation
// with BPF_F_INNER_MAP or BPF_F_MMAPABLE through a feature probe that
// creates such a map itself: when the process is out of file descriptors
// or the memory cgroup refuses the probe's map too, the error reads "inner
// maps not supported (requires >= v5.10)" and drops the errno (and the
// probe's verdict is kept for the life of the process). Creating the same
// map once more with a bare BPF_MAP_CREATE reads the errno; the error
// wraps it (errors.Is(err, unix.EMFILE)) and says what limit it is.
func explainMapCreate(err error, maxEntries, flags uint32) error {
	errno := createArrayErrno(maxEntries, flags)
	if errno == 0 {
		return err // it works now: nothing to add
	}
	return fmt.Errorf("%w (BPF_MAP_CREATE: %w%s)", err, errno, errnoHint(errno))
}

// createArrayErrno creates a u32 array map with BPF_MAP_CREATE and closes it;
// it returns the errno of a failure (0: created).
func createArrayErrno(maxEntries, flags uint32) unix.Errno {
	// The head of union bpf_attr for BPF_MAP_CREATE: map_type, key_size,
	// value_size, max_entries, map_flags; the rest zero.
	var attr [16]uint32
	attr[0], attr[1], attr[2], attr[3], attr[4] = unix.BPF_MAP_TYPE_ARRAY, 4, 4, maxEntries, flags
	fd, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_MAP_CREATE, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	if errno != 0 {
		return errno
	}
	unix.Close(int(fd))
	return 0
}

// errnoHint names the limit behind a map creation's errno.
func errnoHint(errno unix.Errno) string {
	switch {
	case errors.Is(errno, unix.EMFILE):
		var lim unix.Rlimit
		_ = unix.Getrlimit(unix.RLIMIT_NOFILE, &lim)
		return fmt.Sprintf("; the agent has as many files open as RLIMIT_NOFILE allows, %d (hard %d): raise it (LimitNOFILE=, ulimit -n)", lim.Cur, lim.Max)
	case errors.Is(errno, unix.ENFILE):
		return "; the system's file table is full (fs.file-max)"
	case errors.Is(errno, unix.ENOMEM):
		return "; the kernel could not allocate the map: the memory cgroup's limit (memory.max) or, before Linux 5.11, RLIMIT_MEMLOCK"
	case errors.Is(errno, unix.EPERM):
		return "; not permitted: CAP_BPF (or CAP_SYS_ADMIN), or RLIMIT_MEMLOCK before Linux 5.11"
	}
	return ""
}
