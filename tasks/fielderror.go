package tasks

import (
	"strconv"
	"strings"
)

// FieldError is a validation error that names the field at fault; it wraps
// ErrInvalid. Validate returns one for the first bad field it finds.
type FieldError struct {
	// Field is the payload's JSON name of the field, e.g. "to", "expires_at", "headers".
	Field string
	// Key is, for a field that is an object (headers), the key of the bad
	// entry, exactly as given ("X-Campaign"); empty for the field as a whole.
	Key string
	// Reason says what is wrong with it, never quoting a recipient in clear.
	Reason string
}

// Name names the field for people: Field, or Field["Key"] for an entry.
func (e *FieldError) Name() string {
	if e.Key == "" {
		return e.Field
	}
	return e.Field + "[" + strconv.Quote(e.Key) + "]"
}

func (e *FieldError) Error() string { return ErrInvalid.Error() + ": " + e.Name() + " " + e.Reason }

// Unwrap makes errors.Is(err, ErrInvalid) hold.
func (e *FieldError) Unwrap() error { return ErrInvalid }

func invalid(field, why string) error {
	return &FieldError{Field: field, Reason: strings.TrimSpace(why)}
}

// invalidEntry is invalid for one entry of an object field.
func invalidEntry(field, key, why string) error {
	return &FieldError{Field: field, Key: key, Reason: strings.TrimSpace(why)}
}

// CheckID reports whether id is a valid notification id.
func CheckID(id string) error { return checkToken("id", id, MaxIDLen) }
