package smtp

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net/textproto"
	"slices"
	"strings"
	"time"

	"github.com/wneessen/go-mail"
	msmtp "github.com/wneessen/go-mail/smtp"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/tasks"
)

// Config configures a Sender.
type Config struct {
	Host     string
	Port     int
	TLS      string // starttls, opportunistic, tls, none
	CAFile   string // PEM CA certificates trusted instead of the system roots; empty: system roots
	Username string // empty: no AUTH
	Password string
	// AllowPlainAuth lets PLAIN and LOGIN run over an unencrypted connection
	// (TLS none, or opportunistic without STARTTLS). Without it go-mail
	// picks only mechanisms that do not reveal the password there.
	AllowPlainAuth bool
	From           string
	Conns          int           // connections kept open; default 1
	Timeout        time.Duration // per dial and send; default 15s
	// DKIM, when set, signs every email.
	DKIM *DKIMConfig
}

// Sender sends email over SMTP with go-mail, reusing up to Conns
// connections. The Message-ID is derived from the notification id. With
// DKIM, go-mail renders the message into a buffer, go-msgauth signs those
// bytes, and the signed bytes go out over the same pooled connection.
type Sender struct {
	client  *mail.Client
	from    string
	host    string
	timeout time.Duration
	dkim    *DKIMConfig
	pool    chan *msmtp.Client // idle connections
	slots   chan struct{}      // bounds open connections
}

// NewSender returns a sender; it dials lazily.
func NewSender(cfg Config) (*Sender, error) {
	if cfg.Conns < 1 {
		cfg.Conns = 1
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 15 * time.Second
	}
	// The server's certificate must name Host; RootCAs nil means the system roots.
	tlsCfg := &tls.Config{ServerName: cfg.Host, MinVersion: tls.VersionTLS12}
	if cfg.CAFile != "" {
		pool, err := config.LoadCAFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("%w: SMTP CA file %w", config.ErrConfig, err)
		}
		tlsCfg.RootCAs = pool
	}
	// WithTLSPolicy and WithSSL, not go-mail's WithTLSPortPolicy/WithSSLPort:
	// those rewrite a port of 25 to 587 or 465 (and the opportunistic policy
	// falls back to port 25 when that fails); the port here is always the
	// one configured.
	opts := []mail.Option{mail.WithPort(cfg.Port), mail.WithTimeout(cfg.Timeout), mail.WithTLSConfig(tlsCfg)}
	switch cfg.TLS {
	case "starttls", "":
		opts = append(opts, mail.WithTLSPolicy(mail.TLSMandatory))
	case "opportunistic":
		opts = append(opts, mail.WithTLSPolicy(mail.TLSOpportunistic))
	case "tls":
		opts = append(opts, mail.WithSSL())
	case "none":
		opts = append(opts, mail.WithTLSPolicy(mail.NoTLS))
	default:
		return nil, fmt.Errorf("%w: SMTP TLS mode %q", config.ErrConfig, cfg.TLS)
	}
	if cfg.Username != "" {
		// AutoDiscover picks the strongest mechanism offered, and over an
		// unencrypted connection none that reveals the password.
		auth := mail.WithSMTPAuth(mail.SMTPAuthAutoDiscover)
		if cfg.AllowPlainAuth && (cfg.TLS == "none" || cfg.TLS == "opportunistic") {
			auth = mail.WithOpportunisticSMTPAuth(mail.SMTPAuthSCRAMSHA256, mail.SMTPAuthSCRAMSHA1,
				mail.SMTPAuthCramMD5, mail.SMTPAuthPlainNoEnc, mail.SMTPAuthLoginNoEnc)
		}
		opts = append(opts, auth, mail.WithUsername(cfg.Username), mail.WithPassword(cfg.Password))
	}
	c, err := mail.NewClient(cfg.Host, opts...)
	if err != nil {
		return nil, fmt.Errorf("smtp client: %w", err)
	}
	if cfg.DKIM != nil {
		if cfg.DKIM.Key == nil || checkDKIMDomain(cfg.DKIM.Domain) != nil || checkDKIMSelector(cfg.DKIM.Selector) != nil {
			return nil, fmt.Errorf("%w: DKIM needs a domain, a selector and a key", config.ErrConfig)
		}
		if len(cfg.DKIM.Headers) > 0 {
			if err := checkDKIMHeaders(cfg.DKIM.Headers); err != nil {
				return nil, fmt.Errorf("%w: DKIM headers %w", config.ErrConfig, err)
			}
		}
	}
	return &Sender{client: c, from: cfg.From, host: cfg.Host, timeout: cfg.Timeout, dkim: cfg.DKIM,
		pool: make(chan *msmtp.Client, cfg.Conns), slots: make(chan struct{}, cfg.Conns)}, nil
}

// Message returns the email Send sends for n, before any DKIM signature:
// From (n.From, else the configured one), To, Reply-To, Subject,
// Message-ID <id@from-domain>, X-Sluice-Tenant, the custom headers (RFC
// 2047-encoded when not ASCII), List-Unsubscribe with List-Unsubscribe-Post
// for an https URL, and the text body, with the HTML body as its
// multipart/alternative sibling. Errors are permanent: n does not validate.
func (s *Sender) Message(n tasks.Notification) (*mail.Msg, error) {
	m := mail.NewMsg()
	from := n.From
	if from == "" {
		from = s.from
	}
	if err := m.From(from); err != nil {
		return nil, &sender.SendError{Err: fmt.Errorf("from: %w", err), Permanent: true, NotSent: true}
	}
	if err := m.To(n.To); err != nil {
		return nil, &sender.SendError{Err: fmt.Errorf("to: %w", err), Permanent: true, NotSent: true}
	}
	if n.ReplyTo != "" {
		if err := m.ReplyTo(n.ReplyTo); err != nil {
			return nil, &sender.SendError{Err: fmt.Errorf("reply-to: %w", err), Permanent: true, NotSent: true}
		}
	}
	m.Subject(n.Subject)
	m.SetMessageIDWithValue(n.ID + "@" + messageIDHost(from))
	m.SetGenHeader("X-Sluice-Tenant", n.Tenant)
	for _, name := range slices.Sorted(maps.Keys(n.Headers)) {
		// SetGenHeader Q-encodes a value that is not ASCII (RFC 2047) and
		// folds long ones at spaces; tasks.Validate bounded both.
		m.SetGenHeader(goMailHeader(name), n.Headers[name])
	}
	if n.ListUnsubscribe != "" {
		u, err := tasks.ParseListUnsubscribe(n.ListUnsubscribe)
		if err != nil {
			return nil, &sender.SendError{Err: err, Permanent: true, NotSent: true}
		}
		// Folded at the commas (RFC 5322 2.2.3); go-mail writes it as given.
		m.SetGenHeaderPreformatted(mail.HeaderListUnsubscribe, FoldListUnsubscribe(u.URIs()))
		if u.OneClick() {
			m.SetListUnsubscribePost() // RFC 8058: List-Unsubscribe=One-Click
		}
	}
	m.SetBodyString(mail.TypeTextPlain, n.Body)
	if n.HTML != "" {
		m.AddAlternativeString(mail.TypeTextHTML, n.HTML)
	}
	return m, nil
}

// MaxHeaderLine is the line length RFC 5322 (2.1.1) says a header SHOULD
// keep to, CRLF excluded.
const MaxHeaderLine = 78

// FoldListUnsubscribe is the value of a List-Unsubscribe field (after
// "List-Unsubscribe: ") listing uris in angle brackets, comma-separated,
// folded at the whitespace after a comma wherever the line would otherwise
// pass MaxHeaderLine. A URI is never broken: one longer than a line stays
// whole on its own (the field stays within RFC 5322's 998-byte limit, as
// tasks.MaxListUnsubscribeLen bounds it). DKIM's relaxed header
// canonicalization unfolds it, so a signature holds.
func FoldListUnsubscribe(uris []string) string {
	var b strings.Builder
	line := len("List-Unsubscribe: ")
	for i, u := range uris {
		part := "<" + u + ">"
		if i < len(uris)-1 {
			part += ","
		}
		switch {
		case i == 0:
		case line+1+len(part) > MaxHeaderLine:
			b.WriteString("\r\n")
			line = 0
			fallthrough
		default:
			b.WriteByte(' ')
			line++
		}
		b.WriteString(part)
		line += len(part)
	}
	return b.String()
}

// goMailHeader names a custom header for go-mail. go-mail adds User-Agent
// and X-Mailer unless its map holds them under its own spelling, so a
// custom one in another case is given that spelling: it replaces go-mail's
// instead of doubling it.
func goMailHeader(name string) mail.Header {
	for _, h := range []mail.Header{mail.HeaderUserAgent, mail.HeaderXMailer} {
		if strings.EqualFold(name, string(h)) {
			return h
		}
	}
	return mail.Header(name)
}

// Send delivers one email.
func (s *Sender) Send(ctx context.Context, n tasks.Notification) error {
	m, err := s.Message(n)
	if err != nil {
		return err
	}
	var signed []byte
	if s.dkim != nil {
		var raw bytes.Buffer
		if _, err := m.WriteTo(&raw); err != nil {
			return &sender.SendError{Err: fmt.Errorf("render: %w", err), Permanent: true, NotSent: true}
		}
		// Not permanent: a signing failure is the worker's, not the email's.
		if signed, err = s.dkim.sign(raw.Bytes()); err != nil {
			return &sender.SendError{Err: fmt.Errorf("dkim sign: %w", err), NotSent: true}
		}
	}

	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		return &sender.SendError{Err: ctx.Err(), NotSent: true}
	}
	var conn *msmtp.Client
	select {
	case conn = <-s.pool:
		// A reused connection may have been closed by the server: RSET checks it.
		if err := s.client.ResetWithSMTPClient(conn); err != nil {
			_ = conn.Close()
			conn = nil
		}
	default:
	}
	if conn == nil {
		var err error
		conn, err = s.client.DialToSMTPClientWithContext(ctx)
		if err != nil {
			<-s.slots
			return classifySMTP(err, true)
		}
	}
	if signed != nil {
		err = s.sendRaw(conn, m, signed)
	} else if err = s.client.SendWithSMTPClient(conn, m); err != nil {
		err = classifySMTP(err, false)
	}
	if err != nil {
		_ = s.client.CloseWithSMTPClient(conn)
	} else {
		s.pool <- conn
	}
	<-s.slots
	return err
}

// sendRaw sends a rendered message as it is (MAIL, RCPT, DATA): go-mail
// would render it again, and a DKIM signature covers these exact bytes.
// Failing before the end of DATA, the message is surely not sent; without
// a reply to the end of DATA, the outcome is unknown.
func (s *Sender) sendRaw(conn *msmtp.Client, m *mail.Msg, msg []byte) error {
	// The envelope as go-mail would give it: "<address>" of From and To.
	from, err := m.GetSender(false)
	if err != nil {
		return &sender.SendError{Err: err, Permanent: true, NotSent: true}
	}
	rcpts, err := m.GetRecipients()
	if err != nil {
		return &sender.SendError{Err: err, Permanent: true, NotSent: true}
	}
	if err := conn.UpdateDeadline(s.timeout); err != nil {
		return &sender.SendError{Err: err, NotSent: true}
	}
	if err := conn.Mail(from); err != nil {
		return classifyReply(fmt.Errorf("MAIL FROM: %w", err), true)
	}
	for _, to := range rcpts {
		if err := conn.Rcpt(to); err != nil {
			return bounce(classifyReply(fmt.Errorf("RCPT TO: %w", err), true), stageRcpt, replyCode(err))
		}
	}
	w, err := conn.Data()
	if err != nil {
		return classifyReply(fmt.Errorf("DATA: %w", err), true)
	}
	if _, err := w.Write(msg); err != nil {
		// The closing "." was not written: the server cannot have taken it.
		return &sender.SendError{Err: fmt.Errorf("DATA: %w", err), NotSent: true}
	}
	if err := w.Close(); err != nil {
		return bounce(classifyReply(fmt.Errorf("end of DATA: %w", err), false), stageData, replyCode(err))
	}
	return nil
}

// The stages of an SMTP transaction whose refusal can say the mailbox is
// gone.
const (
	stageOther = iota
	stageRcpt
	stageData
)

// bounce marks a permanent refusal that says the recipient's mailbox
// cannot take mail — a hard bounce: any 5xx reply to RCPT TO, and 550, 551
// or 553 at the end of DATA (a 554 there is mostly about the content or
// the sender) — so the worker marks the address undeliverable for the
// tenant (SendError.Suppress). The code goes with it.
func bounce(err error, stage, code int) error {
	var se *sender.SendError
	if !errors.As(err, &se) || !se.Permanent {
		return err
	}
	se.Code = code
	switch {
	case stage == stageRcpt && code >= 500:
		se.Suppress = true
	case stage == stageData && (code == 550 || code == 551 || code == 553):
		se.Suppress = true
	}
	return se
}

// replyCode is the SMTP reply code in err, 0 if none.
func replyCode(err error) int {
	var te *textproto.Error
	if errors.As(err, &te) {
		return te.Code
	}
	return 0
}

// classifyReply classifies an error of the raw SMTP client: a 5xx reply is
// permanent, a 4xx transient, and both mean the message was not taken;
// without a reply the message is not sent only if notSent says so.
func classifyReply(err error, notSent bool) error {
	var te *textproto.Error
	if errors.As(err, &te) {
		switch {
		case te.Code >= 500:
			return &sender.SendError{Err: err, Permanent: true, NotSent: true}
		case te.Code >= 400:
			return &sender.SendError{Err: err, NotSent: true, Throttled: sender.SMTPThrottleCodes[te.Code], Hold: throttleHold(te.Code)}
		}
	}
	return &sender.SendError{Err: err, NotSent: notSent}
}

// Close closes idle connections.
func (s *Sender) Close() error {
	for {
		select {
		case c := <-s.pool:
			_ = s.client.CloseWithSMTPClient(c)
		default:
			return nil
		}
	}
}

func messageIDHost(from string) string {
	if at := strings.LastIndexByte(from, '@'); at >= 0 && at < len(from)-1 {
		return strings.Trim(from[at+1:], "<> ")
	}
	return "sluice.local"
}

// classifySMTP: a 5xx reply is permanent, a 4xx transient; both mean the
// server did not take the message. Without a reply (network trouble) the
// error is transient; the message is surely not sent when it failed at dial.
func classifySMTP(err error, dial bool) error {
	var se *mail.SendError
	code := 0
	if errors.As(err, &se) {
		code = se.ErrorCode()
	}
	switch {
	case code >= 500:
		stage := stageOther
		switch se.Reason {
		case mail.ErrSMTPRcptTo:
			stage = stageRcpt
		case mail.ErrSMTPDataClose:
			stage = stageData
		}
		return bounce(&sender.SendError{Err: err, Permanent: true, NotSent: true}, stage, code)
	case code >= 400:
		return &sender.SendError{Err: err, NotSent: true, Throttled: sender.SMTPThrottleCodes[code], Hold: throttleHold(code)}
	}
	if dial || (se != nil && se.Reason == mail.ErrConnCheck) {
		return &sender.SendError{Err: err, NotSent: true}
	}
	return &sender.SendError{Err: err}
}

// throttleHold is the scope an SMTP throttling reply holds: the relay (the
// provider account), whatever the From.
func throttleHold(code int) string {
	if sender.SMTPThrottleCodes[code] {
		return sender.HoldProvider
	}
	return ""
}
