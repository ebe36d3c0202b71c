//go:build !lanekit_testhooks

package agent

// crashHook does nothing in the shipped binaries: the environment hook
// exists only with -tags lanekit_testhooks.
func crashHook(string) {}
