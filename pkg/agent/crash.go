package agent

// CrashEnv names the environment variable that makes lanekitd kill itself
// (SIGKILL) when an ADD reaches the named step: crash-consistency tests use
// it to stop the agent between programming the datapath and recording it.
// Only a lanekitd built with -tags lanekit_testhooks reads it (the tests
// build their own); the shipped binaries do not contain the hook.
const CrashEnv = "LANEKIT_TEST_CRASH_AT"

// Steps of an ADD (pod or VM) a crash can be injected after.
const (
	StepIntent    = "intent"    // pending record written, address and id reserved
	StepDevice    = "device"    // devices created
	StepRecorded  = "recorded"  // pending record updated with the devices
	StepDatapath  = "datapath"  // map entries written, program attached and pinned
	StepVMAttach  = "vm-attach" // VM steering program attached and pinned
	StepCommitted = "committed" // record committed
)

// AddSteps lists the pod ADD's steps in order.
var AddSteps = []string{StepIntent, StepDevice, StepRecorded, StepDatapath, StepCommitted}

// crashAt is called after each step of an ADD: crashHook, a no-op unless
// built with lanekit_testhooks; tests inside the package replace it.
var crashAt = crashHook
