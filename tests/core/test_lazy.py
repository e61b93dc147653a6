"""finnlite.core.lazy: sympy (imported by onnx_ir) loads only when something uses it."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_streamline_command_imports_do_not_run_sympy():
    out = _run("""
        import sys
        import finnlite.cli, finnlite.build
        print('sympy.core' in sys.modules)
    """)
    assert out == "False"


def test_symbolic_dimensions_still_compute_after_deferral():
    out = _run("""
        import sys
        import finnlite.build
        import onnx_ir as ir
        n = ir.SymbolicDim('N')
        print(n + 1, n * 2, 'sympy.core' in sys.modules)
    """)
    assert out == "N + 1 2*N True"


def test_a_model_with_a_symbolic_batch_loads_and_runs():
    out = _run("""
        import numpy as np
        import onnx
        from onnx import TensorProto, helper
        from finnlite import Model
        from finnlite.core.compat import make_model
        x = helper.make_tensor_value_info('x', TensorProto.FLOAT, ['N', 3])
        y = helper.make_tensor_value_info('y', TensorProto.FLOAT, ['N', 3])
        graph = helper.make_graph([helper.make_node('Relu', ['x'], ['y'])], 'g', [x], [y])
        model = Model(make_model(graph))
        out = model.execute({'x': np.array([[-1, 0, 2]], dtype=np.float32)})
        print(out['y'].tolist())
    """)
    assert out == "[[0.0, 0.0, 2.0]]"
