// Command sidecar-supervisor stops a pod's sidecar once its application
// containers have finished. See the README for how to add it to a pod.
package main

func main() {}
