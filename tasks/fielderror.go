package tasks

import "strings"

// FieldError is a validation error that names the field at fault; it wraps
// ErrInvalid. Validate returns one for the first bad field it finds.
type FieldError struct {
	// Field is the payload's JSON name of the field, e.g. "to", "expires_at".
	Field string
	// Reason says what is wrong with it, never quoting a recipient in clear.
	Reason string
}

func (e *FieldError) Error() string { return ErrInvalid.Error() + ": " + e.Field + " " + e.Reason }

// Unwrap makes errors.Is(err, ErrInvalid) hold.
func (e *FieldError) Unwrap() error { return ErrInvalid }

func invalid(field, why string) error {
	return &FieldError{Field: field, Reason: strings.TrimSpace(why)}
}

// CheckID reports whether id is a valid notification id.
func CheckID(id string) error { return checkToken("id", id, MaxIDLen) }
