package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/spore-run/spore/internal/errdefs"
)

// updateJSON is a row's read-modify-write in a transaction of two round
// trips instead of four: BEGIN and the SELECT ... FOR UPDATE go in one
// pipeline, the UPDATE and COMMIT in another. (A statement that fails in a
// pipeline makes the server skip the rest of it, so a failed UPDATE
// leaves the transaction open and aborted: it is rolled back, as is one
// whose fn fails; a connection released in a transaction is dropped by
// the pool, whatever happened.) The row is locked from the SELECT to the
// COMMIT, as with BEGIN ... COMMIT statement by statement.
//
// selectSQL takes key as $1 and returns the row's data column, decoded
// into v; apply changes v and returns the UPDATE to run.
func updateJSON[T any](ctx context.Context, s *DB, kind, key, selectSQL string, v *T,
	apply func(v *T) (sql string, args []any, err error)) error {
	return updateJSONArgs(ctx, s, kind, key, selectSQL, []any{key}, v, apply)
}

// updateJSONArgs is updateJSON with selectSQL's arguments given (a
// lookup by more than the key: a team's secret by ID or name).
func updateJSONArgs[T any](ctx context.Context, s *DB, kind, key, selectSQL string, selectArgs []any, v *T,
	apply func(v *T) (sql string, args []any, err error)) error {
	return updateJSONIn(ctx, s, kind, key, selectSQL, selectArgs, v, func(_ querier, v *T) (string, []any, error) { return apply(v) })
}

// updateJSONIn is updateJSONArgs whose apply may read and write in the
// transaction (q) before the update (a quota's check).
func updateJSONIn[T any](ctx context.Context, s *DB, kind, key, selectSQL string, selectArgs []any, v *T,
	apply func(q querier, v *T) (sql string, args []any, err error)) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("%s %s: %w", kind, key, err)
	}
	defer conn.Release()
	committed := false
	defer func() {
		if !committed {
			_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		}
	}()
	var data []byte
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(selectSQL, selectArgs...).QueryRow(func(row pgx.Row) error { return row.Scan(&data) })
	if err := decodeRow(conn.SendBatch(ctx, b).Close(), data, v, kind, key); err != nil {
		return err
	}
	sql, args, err := apply(conn, v)
	if err != nil {
		return err
	}
	rows := int64(-1)
	b = &pgx.Batch{}
	b.Queue(sql, args...).Exec(func(tag pgconn.CommandTag) error { rows = tag.RowsAffected(); return nil })
	b.Queue("COMMIT")
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("%s %s: %w", kind, key, err)
	}
	committed = true
	if rows != 1 {
		// The row is locked by this transaction: only a bug gets here.
		return fmt.Errorf("%s %s: the update changed %d rows: %w", kind, key, rows, errdefs.ErrInternal)
	}
	return nil
}
