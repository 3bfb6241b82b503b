//go:build !linux

package isolator

import "errors"

// errNoExchange: the file system cannot exchange two names atomically.
var errNoExchange = errors.New("rename exchange not supported")

// exchange is not available here: the caller renames instead.
func exchange(a, b string) error { return errNoExchange }
