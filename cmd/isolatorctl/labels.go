package main

import (
	"errors"
	"maps"
	"slices"
	"strings"

	isolatordv1 "github.com/isolatord/isolatord/api/isolatord/v1"
)

// labelFilter is list's --label KEY=VALUE, repeatable: a container matches
// when it carries every one of them.
type labelFilter map[string]string

func (f *labelFilter) String() string {
	if f == nil {
		return ""
	}
	return labelsString(*f)
}

func (f *labelFilter) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return errors.New("want KEY=VALUE, such as cni.network=isolator")
	}
	if *f == nil {
		*f = labelFilter{}
	}
	if old, dup := (*f)[k]; dup && old != v {
		return errors.New("label " + k + " given twice with different values")
	}
	(*f)[k] = v
	return nil
}

// filter keeps the containers that carry every label of f.
func (f labelFilter) filter(cs []*isolatordv1.Container) []*isolatordv1.Container {
	if len(f) == 0 {
		return cs
	}
	var out []*isolatordv1.Container
next:
	for _, c := range cs {
		for k, v := range f {
			if got, ok := c.GetLabels()[k]; !ok || got != v {
				continue next
			}
		}
		out = append(out, c)
	}
	return out
}

// labelsString is "k1=v1, k2=v2" sorted by key, or "-" when there is none.
func labelsString(l map[string]string) string {
	if len(l) == 0 {
		return "-"
	}
	parts := make([]string, 0, len(l))
	for _, k := range slices.Sorted(maps.Keys(l)) {
		parts = append(parts, k+"="+l[k])
	}
	return strings.Join(parts, ", ")
}
