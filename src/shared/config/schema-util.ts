/** Building blocks of the config schema shared by its sections. */
import { z } from 'zod';

/** Names of runs and datasets: safe as a folder name, a Redis key part and a BullMQ queue name. */
export const NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.-]*$/;

export const NAME_EXPECTED = 'expected a name of letters, digits, "_", "." or "-" that starts with a letter or digit';

export const name = () => z.string({ error: NAME_EXPECTED }).regex(NAME_PATTERN, { error: NAME_EXPECTED });

export const positiveInt = (what = 'a positive integer') =>
  z.int({ error: `expected ${what}` }).positive({ error: `expected ${what}` });

export const nonNegativeInt = (what = 'an integer >= 0') =>
  z.int({ error: `expected ${what}` }).nonnegative({ error: `expected ${what}` });

export const filePath = (what: string) =>
  z.string({ error: `expected ${what}` }).min(1, { error: `expected ${what}, not an empty string` });
