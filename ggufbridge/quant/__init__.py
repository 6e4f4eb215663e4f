"""Quantisation through the pinned llama.cpp quantiser: file types, class recipes, reports, imatrix, verify."""

from ggufbridge.quant.quantize import QuantResult, quantize_file, quantize_to
from ggufbridge.quant.mix import Mix, load_mix, packaged_names
from ggufbridge.quant.report import QuantReport, format_quant_report, quant_report

__all__ = ["Mix", "QuantReport", "QuantResult", "format_quant_report", "load_mix",
           "packaged_names", "quant_report", "quantize_file",
           "quantize_to"]
