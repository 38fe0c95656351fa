"""CPU kernels for the decode step and their choice by measurement (issue 30)."""
