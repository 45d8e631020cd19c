package server

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// Role is what a bearer token may do. Each role may do everything the
// roles before it may.
type Role uint8

const (
	// RoleNone needs no token (GET /v1/health only).
	RoleNone Role = iota
	// RoleRead may read: every GET (info, rows, metrics) and sample.
	RoleRead
	// RoleWrite may also write rows: extend, priorities, updates of mutable
	// fields, close streams,
	// collector weights.
	RoleWrite
	// RoleAdmin may also manage the server: create and delete buffers,
	// checkpoints, profiles.
	RoleAdmin
)

var roleNames = []string{"none", "read", "write", "admin"}

func (r Role) String() string {
	if int(r) < len(roleNames) {
		return roleNames[r]
	}
	return fmt.Sprintf("Role(%d)", r)
}

// endpointRoles gives every endpoint the role it needs. New refuses to
// register an endpoint that is not here, so no route is ever left open by
// mistake.
var endpointRoles = map[string]Role{
	"health":       RoleNone,
	"metrics":      RoleRead,
	"list":         RoleRead,
	"info":         RoleRead,
	"rows":         RoleRead,
	"sample":       RoleRead,
	"not_found":    RoleRead,
	"collector":    RoleRead,
	"collectors":   RoleRead,
	"activity":     RoleRead,
	"stats":        RoleRead,
	"ui":           RoleNone,
	"extend":       RoleWrite,
	"priorities":   RoleWrite,
	"update":       RoleWrite,
	"close_stream": RoleWrite,
	"weights":      RoleWrite,
	"create":       RoleAdmin,
	"delete":       RoleAdmin,
	"checkpoint":   RoleAdmin,
	"rate_limit":   RoleAdmin,
	"pprof":        RoleAdmin,
}

// Tokens is a set of bearer tokens with their roles. It keeps only the
// tokens' SHA-256 digests: a lookup hashes the token it is given, so the
// time it takes says nothing about how much of a token was right, and the
// set itself never holds a secret to leak.
type Tokens struct {
	byDigest map[[sha256.Size]byte]Role
}

// NewTokens makes a token set; roles must be read, write or admin.
func NewTokens(roles map[string]Role) *Tokens {
	t := &Tokens{byDigest: map[[sha256.Size]byte]Role{}}
	for tok, r := range roles {
		t.byDigest[sha256.Sum256([]byte(tok))] = r
	}
	return t
}

// Len returns the number of tokens.
func (t *Tokens) Len() int {
	if t == nil {
		return 0
	}
	return len(t.byDigest)
}

// role returns the role of token, RoleNone when it is unknown.
func (t *Tokens) role(token string) Role {
	if t == nil || token == "" {
		return RoleNone
	}
	d := sha256.Sum256([]byte(token))
	for known, r := range t.byDigest {
		// Every digest is compared, in constant time each.
		if subtle.ConstantTimeCompare(d[:], known[:]) == 1 {
			return r
		}
	}
	return RoleNone
}

// merge returns a set with the tokens of both (other's role wins).
func (t *Tokens) merge(other *Tokens) *Tokens {
	out := &Tokens{byDigest: map[[sha256.Size]byte]Role{}}
	for _, src := range []*Tokens{t, other} {
		if src != nil {
			for d, r := range src.byDigest {
				out.byDigest[d] = r
			}
		}
	}
	return out
}

// ErrTokenFile is wrapped by every error of ParseTokenFile.
var ErrTokenFile = errors.New("token file")

// minTokenLen is the shortest token a token file may hold: a short token
// is guessed.
const minTokenLen = 16

// ParseTokenFile reads a token file: one "ROLE TOKEN" per line, roles read,
// write or admin, "#" comments and blank lines ignored. Errors name the
// line and never repeat a token.
func ParseTokenFile(data []byte) (*Tokens, error) {
	roles := map[string]Role{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 4096), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		f := strings.Fields(text)
		if len(f) != 2 {
			return nil, fmt.Errorf("%w: line %d: want \"ROLE TOKEN\" (2 words), got %d words", ErrTokenFile, line, len(f))
		}
		var role Role
		switch f[0] {
		case "read":
			role = RoleRead
		case "write":
			role = RoleWrite
		case "admin":
			role = RoleAdmin
		default:
			return nil, fmt.Errorf("%w: line %d: unknown role (want read, write or admin)", ErrTokenFile, line)
		}
		tok := f[1]
		if len(tok) < minTokenLen {
			return nil, fmt.Errorf("%w: line %d: the token is %d characters long; at least %d are needed", ErrTokenFile, line, len(tok), minTokenLen)
		}
		for _, c := range tok {
			if c < 0x21 || c > 0x7e {
				return nil, fmt.Errorf("%w: line %d: the token must be printable ASCII", ErrTokenFile, line)
			}
		}
		if prev, ok := roles[tok]; ok && prev != role {
			return nil, fmt.Errorf("%w: line %d: a token given twice with different roles", ErrTokenFile, line)
		}
		roles[tok] = role
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: line %d: %v", ErrTokenFile, line+1, err)
	}
	if len(roles) == 0 {
		return nil, fmt.Errorf("%w: no tokens", ErrTokenFile)
	}
	return NewTokens(roles), nil
}

// SetTokens replaces the server's tokens at once (a reload); requests in
// flight keep the answer they got. Options.Token stays an admin token.
// With neither, authentication is off.
func (s *Server) SetTokens(t *Tokens) {
	if s.opts.Token != "" {
		t = t.merge(NewTokens(map[string]Role{s.opts.Token: RoleAdmin}))
	}
	s.tokens.Store(t)
}

// authorize checks a request against the role its endpoint needs. It
// returns nil or the error to answer: 401 for no or an unknown token, 403
// for a known token without the role.
func (s *Server) authorize(r *http.Request, need Role) error {
	tokens := s.tokens.Load()
	if need == RoleNone || tokens.Len() == 0 {
		return nil
	}
	got, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	role := tokens.role(got)
	switch {
	case role == RoleNone:
		return &apiError{status: http.StatusUnauthorized, msg: "missing or unknown bearer token (Authorization: Bearer <token>)"}
	case role < need:
		return &apiError{status: http.StatusForbidden, code: "forbidden",
			msg: fmt.Sprintf("this token's role is %s; this endpoint needs %s", role, need)}
	}
	return nil
}
