package exitstatus

import (
	"testing"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
)

// TestMain removes the tools the tests built.
func TestMain(m *testing.M) { pod.RunTests(m) }
