"""Slips for chapter 1 (value function, Monte-Carlo returns)."""
from mutations import Slip

CHAPTER = "01_value_function_mc.ipynb"
MUTATIONS = [
    Slip(name="var-1-over-N", cell=19, old="/ N**2", new="/ N", why="Var of the mean with 1/N, not 1/N^2"),
]
