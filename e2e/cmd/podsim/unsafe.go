package main

import "unsafe"

// unsafePtr gives prctl(PR_SET_NAME) a NUL-terminated copy of s.
func unsafePtr(s string) unsafe.Pointer {
	b := append([]byte(s), 0)
	return unsafe.Pointer(&b[0])
}
