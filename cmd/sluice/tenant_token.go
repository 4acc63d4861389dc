package main

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/tasks"
)

// newTenantTokenCmd is `sluice tenant token create|revoke|list`.
func newTenantTokenCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Manage a tenant's API tokens (sluice api)",
		Long: `A tenant token lets a client of sluice api act for that tenant only. It is
printed once, at creation; Redis keeps only its HMAC-SHA256 under
SLUICE_API_TOKEN_KEY, which must be the API's. Revoking takes effect on the
next request.`,
	}
	cmd.AddCommand(newTenantTokenCreateCmd(), newTenantTokenRevokeCmd(), newTenantTokenListCmd())
	return cmd
}

// newTenantTokenCreateCmd is `sluice tenant token create TENANT`.
func newTenantTokenCreateCmd() *cobra.Command {
	var name, by string
	var asJSON bool
	create := &cobra.Command{
		Use:     "create TENANT",
		Short:   "Create a token for TENANT and print it (the only time it is shown)",
		Example: `  sluice tenant token create acme --name checkout-service`,
		Args:    argsError(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := tasks.CheckTenant(args[0]); err != nil {
				return usageError{err}
			}
			st, rdb, err := tokenStore(true)
			if err != nil {
				return err
			}
			defer rdb.Close()
			tok, info, err := st.Create(cmd.Context(), args[0], name, who(by))
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return json.NewEncoder(out).Encode(map[string]any{"token": tok, "info": info})
			}
			fmt.Fprintln(out, tok)
			fmt.Fprintf(cmd.ErrOrStderr(), "token %s of tenant %s created; it is shown only now: store it (Authorization: Bearer <token>)\n", info.ID, info.Tenant)
			return nil
		},
	}
	create.Flags().StringVar(&name, "name", "", "what the token is for, shown by list")
	create.Flags().StringVar(&by, "by", "", "who creates it, for the record (default: user@host)")
	create.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return create
}

// newTenantTokenRevokeCmd is `sluice tenant token revoke TENANT TOKEN_ID`.
func newTenantTokenRevokeCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "revoke TENANT TOKEN_ID",
		Short: "Revoke one of TENANT's tokens (by the id list shows)",
		Args:  argsError(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := tasks.CheckTenant(args[0]); err != nil {
				return usageError{err}
			}
			st, rdb, err := tokenStore(false)
			if err != nil {
				return err
			}
			defer rdb.Close()
			if err := st.Revoke(cmd.Context(), args[0], args[1]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "token %s of tenant %s revoked\n", args[1], args[0])
			return nil
		},
	}
}

// newTenantTokenListCmd is `sluice tenant token list TENANT`.
func newTenantTokenListCmd() *cobra.Command {
	var asJSON bool
	list := &cobra.Command{
		Use:   "list TENANT",
		Short: "List TENANT's tokens (ids, names, when and by whom created; never the tokens)",
		Args:  argsError(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := tasks.CheckTenant(args[0]); err != nil {
				return usageError{err}
			}
			st, rdb, err := tokenStore(false)
			if err != nil {
				return err
			}
			defer rdb.Close()
			infos, err := st.List(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(infos)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tCREATED\tBY")
			for _, i := range infos {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", i.ID, i.Name, i.CreatedAt.Format("2006-01-02 15:04:05Z07:00"), i.CreatedBy)
			}
			return tw.Flush()
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return list
}

// tokenStore opens the token store of the environment's Redis. Creating
// needs SLUICE_API_TOKEN_KEY; listing and revoking only Redis.
func tokenStore(needKey bool) (*api.Tokens, redis.UniversalClient, error) {
	cfg, err := api.ReadConfig(nil)
	if err != nil {
		return nil, nil, err
	}
	key := cfg.TokenKey
	if !needKey && key == "" {
		key = "only-listing-and-revoking-use-no-key" // ≥ MinTokenKey; never hashes a token here
	}
	if err := api.CheckTokenKey(key); err != nil {
		return nil, nil, fmt.Errorf("%w: %sAPI_TOKEN_KEY %w (it must be the one sluice api runs with)", api.ErrConfig, config.EnvPrefix, err)
	}
	rdb, err := cfg.NewRedisClient()
	if err != nil {
		return nil, nil, err
	}
	st, err := api.NewTokens(rdb, key)
	if err != nil {
		rdb.Close()
		return nil, nil, err
	}
	return st, rdb, nil
}
