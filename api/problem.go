package api

import (
	"net/http"

	"github.com/sluicehq/sluice/internal/problem"
)

// Problem is an RFC 9457 problem detail: every error the API answers is one,
// as application/problem+json.
type Problem = problem.Problem

// InvalidParam is one bad field of a request.
type InvalidParam = problem.InvalidParam

// ProblemBase prefixes every problem type (a URN; the OpenAPI document lists them).
const ProblemBase = problem.TypeBase

func writeProblem(w http.ResponseWriter, status int, kind, detail string, params ...InvalidParam) {
	problem.Write(w, status, kind, detail, params...)
}

func writeJSON(w http.ResponseWriter, status int, v any) { problem.WriteJSON(w, status, v) }

func bodyParam(name, reason, pointer string) InvalidParam {
	return problem.BodyParam(name, reason, pointer)
}

func pointerToken(s string) string { return problem.PointerToken(s) }
