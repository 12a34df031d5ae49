package pod

import (
	"os"
	"testing"
)

// TestMain removes the tools the tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	RemoveTools()
	os.Exit(code)
}
