"""Pure state: fed events and a clock, answers questions. Never imports torch,
textual, zmq or psutil."""

from commviz.model.state import Model
from commviz.model.thresholds import Thresholds

__all__ = ["Model", "Thresholds"]
