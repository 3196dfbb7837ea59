// The column model of the training dataset: its spellings as `datasets` features and Arrow
// types, and the rules that decide whether new rows may be merged into an existing dataset.
import { DataType, type List } from 'apache-arrow';
import { describe, expect, it } from 'vitest';

import {
  arrowSchemaOf,
  columnsOfSchema,
  defaultColumns,
  featuresOf,
  newState,
  planMergeColumns,
  shardName,
  typeString,
  type ColumnSpec,
  type ColumnType,
  type IntType,
} from '../../src/shared/hf-dataset/index.js';

const list = (item: IntType, large = false): ColumnType => ({ kind: 'list', large, item });
const int = (t: IntType): ColumnType => ({ kind: 'int', int: t });
const str: ColumnType = { kind: 'string', large: false };

/** A Python-saved dataset: int64 everywhere (what Dataset.from_dict infers for ints). */
const PY_TARGET: ColumnSpec[] = [
  { name: 'id', type: str },
  { name: 'dataset', type: str },
  { name: 'input_ids', type: list('int64') },
  { name: 'loss_mask', type: list('int64') },
  { name: 'num_tokens', type: int('int64') },
  { name: 'finish_reason', type: str },
];

describe('dataset columns', () => {
  it('spells the default columns as datasets 3.x writes them (`Sequence`, which 4.x/5.x read as `List`)', () => {
    expect(featuresOf(defaultColumns())).toEqual({
      id: { dtype: 'string', _type: 'Value' },
      dataset: { dtype: 'string', _type: 'Value' },
      input_ids: { feature: { dtype: 'int32', _type: 'Value' }, _type: 'Sequence' },
      loss_mask: { feature: { dtype: 'int32', _type: 'Value' }, _type: 'Sequence' },
      num_tokens: { dtype: 'int32', _type: 'Value' },
      finish_reason: { dtype: 'string', _type: 'Value' },
    });
    expect(
      featuresOf([
        { name: 'x', type: list('int64', true) },
        { name: 'y', type: { kind: 'string', large: true } },
      ]),
    ).toEqual({
      x: { feature: { dtype: 'int64', _type: 'Value' }, _type: 'LargeList' },
      y: { dtype: 'large_string', _type: 'Value' },
    });
    expect(defaultColumns({ inputIdsType: 'int64', lossMaskType: 'int8' }).map((c) => typeString(c.type))).toEqual([
      'string',
      'string',
      'list<int64>',
      'list<int8>',
      'int32',
      'string',
    ]);
  });

  it('builds Arrow schemas the way pyarrow spells features (nullable, list items named "item") and reads them back', () => {
    const ints: IntType[] = ['int8', 'int16', 'int32', 'int64', 'uint8', 'uint16', 'uint32', 'uint64'];
    const cols: ColumnSpec[] = [
      ...ints.map((t) => ({ name: `v_${t}`, type: int(t) })),
      ...ints.map((t) => ({ name: `l_${t}`, type: list(t) })),
      { name: 'big', type: list('int64', true) },
      { name: 's', type: str },
      { name: 'ls', type: { kind: 'string', large: true } as ColumnType },
    ];
    const schema = arrowSchemaOf(cols);
    expect(columnsOfSchema(schema)).toEqual(cols);
    expect(schema.fields.every((f) => f.nullable)).toBe(true);
    const ids = schema.fields.find((f) => f.name === 'l_int32');
    expect(DataType.isList(ids?.type)).toBe(true);
    expect((ids?.type as List).children[0]?.name).toBe('item');
    expect((ids?.type as List).children[0]?.nullable).toBe(true);
    expect(JSON.parse(schema.metadata.get('huggingface') ?? '{}')).toEqual({ info: { features: featuresOf(cols) } });
  });

  it('names shards like save_to_disk and writes all seven state.json keys', () => {
    expect(shardName(3, 12)).toBe('data-00003-of-00012.arrow');
    expect(Object.keys(newState(['a.arrow'], 'f')).sort()).toEqual([
      '_data_files',
      '_fingerprint',
      '_format_columns',
      '_format_kwargs',
      '_format_type',
      '_output_all_columns',
      '_split',
    ]);
  });
});

describe('planMergeColumns', () => {
  it("keeps the target's types: new int32 rows go into an int64 target as int64", () => {
    const plan = planMergeColumns(PY_TARGET, defaultColumns());
    expect(plan.problems).toEqual([]);
    expect(plan.columns).toEqual(PY_TARGET);
    expect(plan.dropped).toEqual([]);
  });

  it('refuses an incompatible type, naming the column and both types', () => {
    const target = PY_TARGET.map((c) =>
      c.name === 'loss_mask' ? { ...c, type: { kind: 'other', name: 'list<string>' } as ColumnType } : c,
    );
    const plan = planMergeColumns(target, defaultColumns());
    expect(plan.problems).toHaveLength(1);
    expect(plan.problems[0]).toMatch(
      /^cannot merge: column loss_mask is list<string> in the target but list<int32> in the new rows/,
    );
  });

  it('refuses token ids narrower than 32 bits, a count narrower than 32 bits, and a string column holding ints', () => {
    const target = PY_TARGET.map((c) =>
      c.name === 'input_ids'
        ? { ...c, type: list('int16') }
        : c.name === 'num_tokens'
          ? { ...c, type: int('int16') }
          : c.name === 'id'
            ? { ...c, type: int('int64') }
            : c,
    );
    const problems = planMergeColumns(target, defaultColumns()).problems.join('\n');
    expect(problems).toMatch(
      /column input_ids is list<int16> in the target but list<int32> in the new rows \(token ids need at least 32-bit integers\)/,
    );
    expect(problems).toMatch(/column num_tokens is int16 in the target but int32/);
    expect(problems).toMatch(/column id is int64 in the target but string/);
  });

  it('accepts any integer list for the mask, and unsigned 32-bit ids', () => {
    const target = PY_TARGET.map((c) =>
      c.name === 'loss_mask'
        ? { ...c, type: list('uint8') }
        : c.name === 'input_ids'
          ? { ...c, type: list('uint32') }
          : c,
    );
    expect(planMergeColumns(target, defaultColumns()).problems).toEqual([]);
  });

  it('refuses a target column the new rows lack, and a target without the required columns', () => {
    const withText = [...PY_TARGET, { name: 'text', type: str }];
    expect(planMergeColumns(withText, defaultColumns()).problems).toEqual([
      'cannot merge: the target has column text (string) but the new rows do not',
    ]);
    const noMask = PY_TARGET.filter((c) => c.name !== 'loss_mask');
    expect(planMergeColumns(noMask, defaultColumns()).problems).toEqual([
      'cannot merge: the target has no column loss_mask',
    ]);
  });

  it('leaves out new columns the target does not have', () => {
    const minimal = PY_TARGET.filter((c) => ['id', 'input_ids', 'loss_mask'].includes(c.name));
    const plan = planMergeColumns(minimal, defaultColumns());
    expect(plan.problems).toEqual([]);
    expect(plan.dropped).toEqual(['dataset', 'num_tokens', 'finish_reason']);
    expect(plan.columns.map((c) => c.name)).toEqual(['id', 'input_ids', 'loss_mask']);
  });

  it('for a staged folder, requires extra columns to have the same type', () => {
    const target = [...PY_TARGET, { name: 'score', type: int('int64') }];
    const staged = [...defaultColumns(), { name: 'score', type: int('int32') }];
    expect(planMergeColumns(target, staged, 'staged').problems).toEqual([
      'cannot merge: column score is int64 in the target but int32 in the new rows (different types)',
    ]);
  });
});
