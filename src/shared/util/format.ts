/** Numbers as the command line and the status show them. */

/** `1234567` as `1,234,567`. */
export function formatInt(n: number): string {
  return n.toLocaleString('en-US');
}

/** Seconds as `42s`, `17m` or `2.5h`. */
export function formatDuration(s: number): string {
  if (s < 60) return `${Math.round(s)}s`;
  if (s < 3600) return `${Math.round(s / 60)}m`;
  return `${(s / 3600).toFixed(1)}h`;
}
