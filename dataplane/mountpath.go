package dataplane

// MountPath is where Setup bind-mounts a container's namespace handle
// (<netns-dir>/<container-id>); the lifecycle records it when recovery
// finds an interrupted isolate complete.
func (d *DataPlane) MountPath(id string) string { return d.mountPath(id) }
