package tasks

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

// Sealed payloads. A notification names and talks to a person (recipient,
// subject, body, reply-to, metadata), so the payload Redis keeps for it is
// encrypted whole with AES-256-GCM: only the key id is readable. The
// additional data is the task id and type, so a sealed payload moved to
// another task does not open.
//
// Format: "sealed.v1.<key id>.<base64url(nonce ‖ ciphertext ‖ tag)>".

var (
	// ErrSealed reports a payload that does not open: an unknown key id, a
	// wrong key, a payload moved to another task, or a damaged one.
	ErrSealed = errors.New("sealed payload does not open")
	// ErrNotSealed reports a plaintext payload where only sealed ones are accepted.
	ErrNotSealed = errors.New("payload is not sealed")
	// ErrKeys reports a key ring that does not parse.
	ErrKeys = errors.New("bad payload keys")
)

const sealPrefix = "sealed.v1."

// Keyring holds the payload keys: the first seals, every one opens, so keys
// rotate without downtime (add the new key first, then drop the old one
// once no task sealed with it is left).
type Keyring struct {
	ids  []string
	aead map[string]cipher.AEAD
}

// ParseKeyring reads "ID:KEY[,ID:KEY...]": ID is 1–32 of [A-Za-z0-9_-], KEY
// 32 bytes in base64 (standard or URL alphabet, padding optional). The error
// names the entry, never the key.
func ParseKeyring(spec string) (*Keyring, error) {
	k := &Keyring{aead: map[string]cipher.AEAD{}}
	for i, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		id, b64, ok := strings.Cut(part, ":")
		if !ok || !validKeyID(id) {
			return nil, fmt.Errorf("%w: entry %d: want ID:BASE64KEY with an ID of 1–32 of A-Z a-z 0-9 _ -", ErrKeys, i+1)
		}
		if _, dup := k.aead[id]; dup {
			return nil, fmt.Errorf("%w: entry %d: key id %q given twice", ErrKeys, i+1, id)
		}
		key, err := decodeKey(b64)
		if err != nil || len(key) != 32 {
			return nil, fmt.Errorf("%w: entry %d (%s): the key must be 32 bytes in base64 (e.g. `openssl rand -base64 32`)", ErrKeys, i+1, id)
		}
		block, _ := aes.NewCipher(key)
		gcm, _ := cipher.NewGCM(block)
		k.ids = append(k.ids, id)
		k.aead[id] = gcm
	}
	if len(k.ids) == 0 {
		return nil, fmt.Errorf("%w: no key given", ErrKeys)
	}
	return k, nil
}

// NewKeySpec returns a fresh "ID:KEY" entry for a key ring.
func NewKeySpec(id string) string {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	return id + ":" + base64.StdEncoding.EncodeToString(key)
}

// SealingKey is the id of the key that seals.
func (k *Keyring) SealingKey() string { return k.ids[0] }

func validKeyID(id string) bool {
	if id == "" || len(id) > 32 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func decodeKey(s string) ([]byte, error) {
	s = strings.TrimRight(strings.TrimSpace(s), "=")
	if strings.ContainsAny(s, "-_") {
		return base64.RawURLEncoding.DecodeString(s)
	}
	return base64.RawStdEncoding.DecodeString(s)
}

func additional(taskID, taskType string) []byte {
	return []byte("sluice.v1|" + taskID + "|" + taskType)
}

// Seal encrypts a payload for the task with this id and type.
func (k *Keyring) Seal(taskID, taskType string, plain []byte) []byte {
	id := k.ids[0]
	gcm := k.aead[id]
	nonce := make([]byte, gcm.NonceSize(), gcm.NonceSize()+len(plain)+gcm.Overhead())
	_, _ = rand.Read(nonce)
	ct := gcm.Seal(nonce, nonce, plain, additional(taskID, taskType))
	out := make([]byte, 0, len(sealPrefix)+len(id)+1+base64.RawURLEncoding.EncodedLen(len(ct)))
	out = append(out, sealPrefix...)
	out = append(out, id...)
	out = append(out, '.')
	return base64.RawURLEncoding.AppendEncode(out, ct)
}

// IsSealed reports whether a payload is in the sealed format.
func IsSealed(payload []byte) bool { return bytes.HasPrefix(payload, []byte(sealPrefix)) }

// Open decrypts a sealed payload of the task with this id and type.
func (k *Keyring) Open(taskID, taskType string, payload []byte) ([]byte, error) {
	rest, ok := bytes.CutPrefix(payload, []byte(sealPrefix))
	if !ok {
		return nil, ErrNotSealed
	}
	id, b64, ok := bytes.Cut(rest, []byte{'.'})
	if !ok {
		return nil, fmt.Errorf("%w: no key id", ErrSealed)
	}
	gcm, ok := k.aead[string(id)]
	if !ok {
		return nil, fmt.Errorf("%w: key %q is not in SLUICE_PAYLOAD_KEYS", ErrSealed, id)
	}
	ct, err := base64.RawURLEncoding.DecodeString(string(b64))
	if err != nil || len(ct) < gcm.NonceSize()+gcm.Overhead() {
		return nil, fmt.Errorf("%w: damaged", ErrSealed)
	}
	plain, err := gcm.Open(nil, ct[:gcm.NonceSize()], ct[gcm.NonceSize():], additional(taskID, taskType))
	if err != nil {
		return nil, fmt.Errorf("%w: key %q: wrong key, damaged, or sealed for another task", ErrSealed, id)
	}
	return plain, nil
}
