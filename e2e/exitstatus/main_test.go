package exitstatus

import (
	"os"
	"testing"

	"github.com/sidecar-supervisor/sidecar-supervisor/e2e/pod"
)

// TestMain removes the tools the tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	pod.RemoveTools()
	os.Exit(code)
}
