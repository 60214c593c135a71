from tests.support.verifier_mods._misbehave import make
from verifiers import synthetic

NAME, VERSION = "synthetic", "hangs-with-a-child-1"
SELF_TEST = synthetic.SELF_TEST
score = make("hangs_with_a_child")
