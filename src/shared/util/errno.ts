/** Whether `e` is a Node.js system error with this `code` (`ENOENT`, `EEXIST`, …). */
export function isErrno(e: unknown, code: string): boolean {
  return typeof e === 'object' && e !== null && (e as { code?: unknown }).code === code;
}
