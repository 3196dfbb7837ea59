import type { MergeReport, MergeReportSummary } from '../../shared/index.js';

/** The brief form of a merge report that a merge job returns. */
export function summarizeReport(report: MergeReport, reportPath: string): MergeReportSummary {
  return {
    mergeId: report.mergeId,
    target: report.target,
    reportPath,
    firstMerge: report.firstMerge,
    oldRows: report.oldRows,
    newRows: report.newRows,
    rows: report.rows,
    oldTokens: report.oldTokens,
    newTokens: report.newTokens,
    tokens: report.tokens,
    supervisedTokens: report.supervisedTokens,
    lossMaskCoverage: report.lossMaskCoverage,
    newLossMaskCoverage: report.newLossMaskCoverage,
    shards: report.shards,
    newShards: report.newShards.length,
    ...(report.dflash === undefined
      ? {}
      : {
          dflash: {
            rowsWithoutAnchor: report.dflash.rowsWithoutAnchor,
            newRowsWithoutAnchor: report.dflash.newRowsWithoutAnchor,
            anchorPositions: report.dflash.anchorPositions,
            maskToken: report.dflash.maskToken,
          },
        }),
    checkedSamples: report.checkedSamples,
    problems: report.problems,
    warnings: report.warnings,
  };
}
