module github.com/sidecar-supervisor/sidecar-supervisor

go 1.26.0
