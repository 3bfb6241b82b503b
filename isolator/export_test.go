package isolator

// SetHook installs a fault-injection hook called at named points.
func (s *Isolator) SetHook(h func(point string)) { s.hook = h }
