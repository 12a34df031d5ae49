package exitwatch

import "testing"

func TestDecodeWaitStatus(t *testing.T) {
	tests := []struct {
		raw       uint32
		want      Status
		container int
	}{
		{0, Status{Known: true}, 0},
		{3 << 8, Status{Known: true, Code: 3}, 3},
		{255 << 8, Status{Known: true, Code: 255}, 255},
		{9, Status{Known: true, Signal: 9}, 137},
		{15, Status{Known: true, Signal: 15}, 143},
		{11 | 0x80, Status{Known: true, Signal: 11}, 139}, // with a core dump
	}
	for _, tt := range tests {
		got := decodeWaitStatus(tt.raw)
		if got != tt.want || got.ContainerCode() != tt.container {
			t.Errorf("decodeWaitStatus(%#x) = %+v (code %d), want %+v (code %d)", tt.raw, got, got.ContainerCode(), tt.want, tt.container)
		}
	}
}

func TestGraceful(t *testing.T) {
	for sig, want := range map[Signal]bool{SIGTERM: true, SIGINT: true, 1: true, 10: true, 34: true, SIGKILL: false, 19: false, 17: false, 18: false} {
		if sig.Graceful() != want {
			t.Errorf("%v.Graceful() = %v, want %v", sig, !want, want)
		}
	}
}

func TestMethodText(t *testing.T) {
	var m Method
	for in, want := range map[string]Method{"auto": Auto, " PIDFD ": Pidfd, "ptrace": Ptrace, "None": None} {
		if err := m.UnmarshalText([]byte(in)); err != nil || m != want {
			t.Errorf("%q: %q, %v; want %q", in, m, err, want)
		}
	}
	if err := m.UnmarshalText([]byte("strace")); err == nil {
		t.Error("strace accepted")
	}
}
